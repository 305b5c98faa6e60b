"""The built-in analyzers on real decoded frames (PyAV), from the generated fixtures.

The fixture clips come from ``fixtures/make_fixtures.py``; when ``fixtures/media`` lacks
one, it is generated into a temporary directory (once per test session). Frame metadata
uses the clip's own timestamps (RTP clock units) and a synthetic ``decoded_at`` at the
clip's frame rate, so rates are exact and no test sleeps. The helpers here (no ``test_``
prefix) are shared with ``test_processor.py``.
"""

from __future__ import annotations

import io
import itertools
import os
import random
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from fixtures.make_fixtures import CUT_FRAME, FIXTURES, MEDIA, ensure
from pipeline.analyzers import (
    AudioSilence,
    FrameStats,
    SceneChange,
    Thumbnailer,
    VideoBlack,
    level_dbfs,
    media_ms,
)
from pipeline.analyzers.base import Episode
from pipeline.analyzers.silence import MIN_DBFS
from pipeline.analyzers.thumbnail import thumbnail_size
from pipeline.decoder import DecodeStats, FrameMeta
from pipeline.frame import EncodedFrame
from pipeline.intake import FrameIntake

FPS = 30
VIDEO_CLOCK = 90000
AUDIO_CLOCK = 48000


_clips: dict[str, Path] = {}


def clip_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture clip: the repository's, or generated (once per test session, a few
    seconds) into a temporary directory when the checkout lacks it."""
    if not _clips:
        root: Path | None = None
        for name in FIXTURES:
            if (MEDIA / name).exists():
                _clips[name] = MEDIA / name
                continue
            root = root or tmp_path_factory.mktemp("media")
            _clips[name] = ensure(name, root)
    return dict(_clips)


@pytest.fixture(scope="session")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return clip_paths(tmp_path_factory)


def video_frames(path: Path, fps: int = FPS) -> Iterator[tuple[av.VideoFrame, FrameMeta]]:
    """Decoded pictures of ``path`` with metadata as the decode worker would make it
    (90 kHz timestamps; ``decoded_at`` = frame index / fps)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        index = 0
        for packet in container.demux(stream):
            for frame in packet.decode():
                assert isinstance(frame, av.VideoFrame)
                assert frame.pts is not None and frame.time_base is not None
                meta = FrameMeta(
                    kind="video",
                    codec="H264",
                    index=index,
                    timestamp=round(frame.pts * frame.time_base * VIDEO_CLOCK),
                    keyframe=frame.key_frame,
                    arrival=index / fps,
                    decoded_at=index / fps,
                )
                yield frame, meta
                index += 1


def audio_frames(path: Path) -> Iterator[tuple[av.AudioFrame, FrameMeta]]:
    """Decoded audio of ``path`` (Opus) with 48 kHz timestamps."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        index = 0
        for packet in container.demux(stream):
            for frame in packet.decode():
                assert isinstance(frame, av.AudioFrame)
                assert frame.pts is not None and frame.time_base is not None
                at = max(0, round(frame.pts * frame.time_base * AUDIO_CLOCK))
                meta = FrameMeta(
                    "audio", "opus", index, at, True, at / AUDIO_CLOCK, at / AUDIO_CLOCK
                )
                yield frame, meta
                index += 1


def still(width: int, height: int, level: int) -> av.VideoFrame:
    """A flat yuv420p picture of luma ``level`` (full-range 0..255 as RGB gray)."""
    image = np.full((height, width, 3), level, np.uint8)
    return av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")


def meta_at(
    index: int, *, kind: str = "video", codec: str = "H264", key: bool = False
) -> FrameMeta:
    """Metadata of frame ``index`` of a 30 fps video track (or 20 ms audio frames)."""
    if kind == "video":
        return FrameMeta("video", codec, index, index * 3000, key, index / FPS, index / FPS)
    return FrameMeta("audio", codec, index, index * 960, True, index / 50, index / 50)


# ---------------------------------------------------------------- media time


def test_media_time_uses_each_codecs_rtp_clock() -> None:
    assert media_ms(FrameMeta("video", "VP8", 0, 90000, True, 0, 0)) == 1000
    assert media_ms(FrameMeta("audio", "opus", 0, 48000, True, 0, 0)) == 1000
    assert media_ms(FrameMeta("audio", "PCMU", 0, 8000, True, 0, 0)) == 1000
    assert media_ms(FrameMeta("audio", "G722", 0, 8000, True, 0, 0)) == 1000


# ---------------------------------------------------------------- scene change


def test_scene_change_fires_once_on_the_cut_and_never_within_a_scene(
    clips: dict[str, Path],
) -> None:
    scene = SceneChange()
    history: list[tuple[int, str, dict[str, object]]] = []
    scores: dict[int, float] = {}
    for frame, meta in video_frames(clips["two_scenes_360p.mp4"]):
        for etype, data in scene.process(frame, meta):
            history.append((meta.index, etype, data))
        scores[meta.index] = scene.score
    assert [(index, etype) for index, etype, _ in history] == [(CUT_FRAME, "scene_change")]
    data = history[0][2]
    assert data["at_ms"] == 3500
    assert isinstance(data["score"], float) and data["score"] >= 0.9
    within = [score for index, score in scores.items() if index != CUT_FRAME]
    assert max(within) < 0.2  # well clear of the 0.4 default on either side
    assert scene.events == 1


def test_scene_change_stays_quiet_on_a_slowly_moving_720p_pattern(
    clips: dict[str, Path],
) -> None:
    scene = SceneChange()
    events = []
    top = 0.0
    for frame, meta in video_frames(clips["pattern_720p.mp4"]):
        events += scene.process(frame, meta)
        top = max(top, scene.score)
    assert events == []
    assert top < 0.1


def test_scene_change_minimum_gap_merges_close_cuts(clips: dict[str, Path]) -> None:
    # black_silence has cuts at 1.0 s (pattern -> black) and 3.5 s (black -> pattern).
    def cuts(min_gap_s: float) -> list[object]:
        scene = SceneChange(min_gap_s=min_gap_s)
        found = []
        for frame, meta in video_frames(clips["black_silence_360p.mp4"]):
            found += [data["at_ms"] for _, data in scene.process(frame, meta)]
        return found

    assert cuts(1.0) == [1000, 3500]
    assert cuts(3.0) == [1000]


def _stripes(offset: int, period: int) -> av.VideoFrame:
    """A 1280x720 yuv420p picture of full-width horizontal stripes, ``period`` rows a
    cycle (half dark, half light, video levels 16 and 235), shifted down ``offset``
    rows: fine lines, as in a screen share of a table or text."""
    rows = (np.arange(720) - offset) % period < period // 2
    luma = np.where(rows, 16, 235).astype(np.uint8)[:, None].repeat(1280, axis=1)
    planes = np.concatenate([luma, np.full((360, 1280), 128, np.uint8)])
    return av.VideoFrame.from_ndarray(planes, format="yuv420p")


@pytest.mark.parametrize("period", [2, 3, 4, 6])
def test_scene_change_stays_quiet_when_fine_stripes_start_scrolling(period: int) -> None:
    # The picture stands still, then scrolls one row a frame, stops, scrolls three rows a
    # frame. Every row of the luma plane is read: reading every other row (half the
    # memory traffic) scored 1.0 on periods 2 and 6 here, false cuts, as the shifted
    # rows flip the sampled means between dark and light.
    offsets = [0] * 5 + list(range(1, 11)) + [10] * 5 + list(range(13, 43, 3))
    scene = SceneChange()
    events = []
    top = 0.0
    for index, offset in enumerate(offsets):
        events += scene.process(_stripes(offset, period), meta_at(index))
        top = max(top, scene.score)
    assert events == []
    assert top < 0.3


def test_scene_change_refuses_a_threshold_outside_0_1() -> None:
    with pytest.raises(ValueError, match="threshold"):
        SceneChange(threshold=1.5)


# ---------------------------------------------------------------- frame stats


def test_stats_fps_is_30_on_a_30_fps_sequence_with_periodic_events(
    clips: dict[str, Path],
) -> None:
    stats = FrameStats("video", interval_s=1.0)
    periodic = []
    for frame, meta in video_frames(clips["two_scenes_360p.mp4"]):
        periodic += [(meta.index, data) for _, data in stats.process(frame, meta)]
    # 180 frames span 5.97 s: one event per elapsed second, at frames 30, 60, ... 150.
    assert [index for index, _ in periodic] == [30, 60, 90, 120, 150]
    for _, data in periodic:
        assert data["fps"] == pytest.approx(30.0, abs=0.01)
        assert (data["codec"], data["width"], data["height"]) == ("H264", 640, 360)
        assert data["kind"] == "video"
    last = stats.snapshot()
    assert last["frames_decoded"] == 180
    assert last["keyframes"] == last["keyframes_decoded"] == 6  # GOP 30
    assert last["rate_window_s"] == pytest.approx(2.0)
    required = {"codec", "width", "height", "frames_decoded", "frames_dropped"}
    required |= {"decode_errors", "fps", "bitrate_bps", "keyframes"}
    assert required <= set(last)


def _encoded(index: int, size: int, keyframe: bool) -> EncodedFrame:
    return EncodedFrame("video", "H264", b"\x00" * size, index * 3000, keyframe, index / FPS)


@pytest.mark.parametrize("counters", [False, True])
@pytest.mark.parametrize("keyframes_only", [False, True])
def test_stats_bitrate_fps_and_keyframes_come_from_the_intake_counters(
    keyframes_only: bool, counters: bool
) -> None:
    """1250-byte frames at 30 fps are 300 kb/s whichever frames get decoded: with
    ``keyframes_only`` the worker decodes one frame per GOP, yet fps and keyframes
    still describe the stream. The per-frame rate samples read the same figures from
    ``intake_stats()`` or, cheaper, from ``intake_counters()``."""
    intake = FrameIntake("video", depth=8, payload_limit=4096)
    decode = DecodeStats("video")
    decode.decode_errors = 2
    stats = FrameStats(
        "video",
        intake_stats=intake.stats,
        decode_stats=lambda: decode,
        intake_counters=(lambda: (intake.frames_in, intake.bytes_in)) if counters else None,
        interval_s=None,
        keyframes_only=keyframes_only,
    )
    picture = still(64, 36, 100)
    for index in range(120):
        keyframe = index % 30 == 0
        assert intake.put(_encoded(index, 1250, keyframe))
        assert intake.get(timeout=1) is not None
        if keyframe or not keyframes_only:
            stats.process(picture, meta_at(index, key=keyframe))
    data = stats.snapshot()
    assert data["bitrate_bps"] == 300_000
    assert data["encoded_fps"] == pytest.approx(30.0)
    assert data["fps"] == pytest.approx(30.0)  # the stream's rate in both policies
    assert data["decoded_fps"] == pytest.approx(1.0 if keyframes_only else 30.0)
    assert data["frames_in"] == 120
    assert data["keyframes"] == 4
    assert data["frames_decoded"] == (4 if keyframes_only else 120)
    assert data["decode_errors"] == 2


def test_stats_frames_dropped_are_the_intakes_drops() -> None:
    intake = FrameIntake("video", depth=2, payload_limit=4096)
    stats = FrameStats("video", intake_stats=intake.stats, interval_s=None)
    for index in range(5):  # nothing consumed: 2 queued, 3 dropped
        intake.put(_encoded(index, 100, index == 0))
    stats.process(still(64, 36, 100), meta_at(0, key=True))
    assert stats.snapshot()["frames_dropped"] == 3


def test_stats_emit_at_once_on_resolution_and_codec_changes(clips: dict[str, Path]) -> None:
    stats = FrameStats("video", interval_s=None)
    history: list[tuple[int, object, object, object, object]] = []
    small = list(itertools.islice(video_frames(clips["two_scenes_360p.mp4"]), 10))
    large = list(itertools.islice(video_frames(clips["pattern_720p.mp4"]), 10))
    for index, (frame, _) in enumerate(small + large):
        codec = "VP8" if index >= 15 else "H264"
        for etype, data in stats.process(frame, meta_at(index, codec=codec)):
            assert etype == "stats"
            history.append((index, data["change"], data["previous"], data["width"], data["codec"]))
    assert history == [
        (10, "resolution", {"width": 640, "height": 360}, 1280, "H264"),
        (15, "codec", {"codec": "H264"}, 1280, "VP8"),
    ]


def test_stats_audio_format_change_and_final_figures() -> None:
    stats = FrameStats("audio", interval_s=None)
    mono = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.int16), format="s16", layout="mono")
    mono.sample_rate = 48000
    stereo = av.AudioFrame.from_ndarray(
        np.zeros((1, 1920), np.int16), format="s16", layout="stereo"
    )
    stereo.sample_rate = 48000
    changes = []
    for index in range(101):
        frame = mono if index < 50 else stereo
        changes += [
            data["change"] for _, data in stats.process(frame, meta_at(index, kind="audio"))
        ]
    assert changes == ["format"]
    final = stats.final()
    assert (final["sample_rate"], final["channels"], final["width"]) == (48000, 2, None)
    assert final["duration_s"] == pytest.approx(2.0)
    assert final["avg_fps"] == pytest.approx(50.0)


def test_stats_rates_read_zero_until_two_frames() -> None:
    stats = FrameStats("video")
    assert stats.snapshot()["fps"] == 0.0
    stats.process(still(64, 36, 50), meta_at(0, key=True))
    data = stats.snapshot()
    assert (data["fps"], data["bitrate_bps"], data["rate_window_s"]) == (0.0, 0, 0.0)


# ---------------------------------------------------------------- thumbnails


def _decode_jpeg(data: bytes) -> av.VideoFrame:
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"  # SOI ... EOI
    decoder = av.CodecContext.create("mjpeg", "r")
    frames = decoder.decode(av.Packet(data))
    assert len(frames) == 1
    frame = frames[0]
    assert isinstance(frame, av.VideoFrame)
    return frame


def test_thumbnail_is_a_valid_jpeg_capped_to_640_wide(
    clips: dict[str, Path], tmp_path: Path
) -> None:
    thumbs = Thumbnailer(tmp_path / "thumbs", "r_test", interval_s=1.0)
    assert thumbs.latest() is None
    events = []
    for frame, meta in video_frames(clips["pattern_720p.mp4"]):
        events += thumbs.process(frame, meta)
    assert events == []  # no timeline noise
    assert thumbs.encoded == thumbs.written == 3  # at 0 s, 1 s and 2 s of a 3 s clip
    jpeg = thumbs.latest()
    assert jpeg is not None
    picture = _decode_jpeg(jpeg)
    assert (picture.width, picture.height) == (640, 360) == thumbs.latest_size()
    assert (tmp_path / "thumbs" / "r_test.jpg").read_bytes() == jpeg
    # The picture is the clip's, not a blank: mean luma of the wave pattern is mid-gray.
    luma = picture.reformat(format="gray").to_ndarray()
    assert 80 < float(luma.mean()) < 180
    # It decodes as a file too (what a browser fetching thumbnail.jpg gets).
    with av.open(io.BytesIO(jpeg), format="mjpeg") as container:
        assert container.streams.video[0].codec_context.width == 640


def test_thumbnail_file_is_replaced_atomically(clips: dict[str, Path], tmp_path: Path) -> None:
    thumbs = Thumbnailer(tmp_path, "r_atomic", interval_s=1.0)
    path = tmp_path / "r_atomic.jpg"
    frames = list(video_frames(clips["two_scenes_360p.mp4"]))
    frame, meta = frames[0]
    thumbs.process(frame, meta)
    first = path.read_bytes()
    with path.open("rb") as reader:  # a reader that opened the old file...
        inode = os.fstat(reader.fileno()).st_ino
        for frame, meta in frames[1:]:
            thumbs.process(frame, meta)
            if meta.index == 4 * 30:  # 4.0 s, into the second scene
                break
        assert reader.read() == first  # ...keeps reading the whole old picture
    assert thumbs.written == 5  # 0, 1, 2, 3, 4 s
    assert os.stat(path).st_ino != inode  # a new file was renamed over it
    assert path.read_bytes() == thumbs.latest() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r_atomic.jpg"]  # no temp left


def test_thumbnail_write_failure_is_counted_not_raised(
    clips: dict[str, Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    thumbs = Thumbnailer(blocker, "r_x", interval_s=1.0)
    for frame, meta in itertools.islice(video_frames(clips["pattern_720p.mp4"]), 31):
        thumbs.process(frame, meta)
    assert (thumbs.encoded, thumbs.written, thumbs.write_errors) == (2, 0, 2)
    assert thumbs.latest() is not None


def test_thumbnail_disabled_and_sizes() -> None:
    thumbs = Thumbnailer(None, "r_off", interval_s=0)
    thumbs.process(still(64, 36, 10), meta_at(0))
    assert thumbs.latest() is None and thumbs.encoded == 0
    assert thumbnail_size(1920, 1080, 640) == (640, 360)
    assert thumbnail_size(641, 481, 640) == (640, 480)
    assert thumbnail_size(320, 181, 640) == (320, 180)
    assert thumbnail_size(3, 1, 640) == (2, 2)
    with pytest.raises(ValueError, match="plain file name"):
        Thumbnailer(Path("/tmp"), "../escape")


def test_thumbnail_encoder_follows_a_resolution_change() -> None:
    thumbs = Thumbnailer(None, "r_res", interval_s=0.001)
    thumbs.process(still(320, 180, 90), meta_at(0))
    first = thumbs.latest_size()
    thumbs.process(still(1280, 720, 90), meta_at(1))
    assert (first, thumbs.latest_size()) == ((320, 180), (640, 360))
    latest = thumbs.latest()
    assert latest is not None
    assert _decode_jpeg(latest).width == 640


# ---------------------------------------------------------------- silence


def test_silence_start_and_end_between_two_tones(clips: dict[str, Path]) -> None:
    silence = AudioSilence()
    history = []
    levels = []
    for frame, meta in audio_frames(clips["black_silence_360p.mp4"]):
        for etype, data in silence.process(frame, meta):
            history.append((etype, data["state"], data))
        levels.append(silence.level_dbfs)
    assert [(etype, state) for etype, state, _ in history] == [
        ("audio_silence", "start"),
        ("audio_silence", "end"),
    ]
    start, end = history[0][2], history[1][2]
    assert start["at_ms"] == pytest.approx(1000, abs=60)  # Opus pre-skip and overlap
    assert start["level_dbfs"] == MIN_DBFS
    assert end["duration_ms"] == pytest.approx(2500, abs=80)
    assert end["at_ms"] == pytest.approx(3500, abs=60)
    assert max(levels) == pytest.approx(-15, abs=2)  # the 0.25 amplitude tone
    assert not silence.silent


def test_silence_shorter_than_the_minimum_is_not_an_episode() -> None:
    silence = AudioSilence(min_duration_s=2.0)
    quiet = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.int16), format="s16", layout="mono")
    quiet.sample_rate = 48000
    events = []
    for index in range(99):  # 1.98 s
        events += silence.process(quiet, meta_at(index, kind="audio", codec="opus"))
    assert events == []
    events += silence.process(quiet, meta_at(99, kind="audio", codec="opus"))
    assert [data["state"] for _, data in events] == ["start"]
    assert [data["reason"] for _, data in silence.close()] == ["stream_end"]


def _tone(fmt: str, layout: str, amplitude: float) -> av.AudioFrame:
    channels = 2 if layout == "stereo" else 1
    t = np.arange(960) / 48000
    wave = np.sign(np.sin(2 * np.pi * 100 * t)) * amplitude  # a square wave: RMS = amplitude
    planar = fmt.endswith("p")
    base = fmt.removesuffix("p")
    scale = {"s16": 32767, "s32": 2147483647, "flt": 1.0, "dbl": 1.0, "u8": 127}[base]
    values = wave * scale + (128 if base == "u8" else 0)
    dtype = {"s16": np.int16, "s32": np.int32, "flt": np.float32, "dbl": np.float64, "u8": np.uint8}
    if planar:
        array = np.repeat(values[None, :], channels, axis=0)
    else:
        array = np.repeat(values, channels)[None, :]
    frame = av.AudioFrame.from_ndarray(array.astype(dtype[base]), format=fmt, layout=layout)
    frame.sample_rate = 48000
    return frame


@pytest.mark.parametrize("fmt", ["s16", "s16p", "s32", "flt", "fltp", "dbl", "u8"])
@pytest.mark.parametrize("layout", ["mono", "stereo"])
def test_level_dbfs_in_every_sample_format_and_layout(fmt: str, layout: str) -> None:
    assert level_dbfs(_tone(fmt, layout, 0.5)) == pytest.approx(-6.02, abs=0.1)
    assert level_dbfs(_tone(fmt, layout, 0.0)) == MIN_DBFS


# ---------------------------------------------------------------- black


def test_black_start_and_end(clips: dict[str, Path]) -> None:
    black = VideoBlack()
    history = []
    for frame, meta in video_frames(clips["black_silence_360p.mp4"]):
        history += [(meta.index, etype, data) for etype, data in black.process(frame, meta)]
    assert history == [
        (90, "video_black", {"state": "start", "at_ms": 1000, "luma": 0.0}),
        (105, "video_black", {"state": "end", "at_ms": 3500, "duration_ms": 2500}),
    ]


def test_black_episode_open_at_stream_end_is_closed_by_close(clips: dict[str, Path]) -> None:
    black = VideoBlack()
    events = []
    for frame, meta in video_frames(clips["black_silence_360p.mp4"]):
        if meta.index == 95:
            break
        events += black.process(frame, meta)
    assert [data["state"] for _, data in events] == ["start"]
    assert black.black
    assert black.close() == [
        (
            "video_black",
            {"state": "end", "at_ms": 3133, "duration_ms": 2133, "reason": "stream_end"},
        )
    ]
    assert black.close() == []


def test_black_hysteresis_keeps_a_near_black_picture_in_the_episode() -> None:
    black = VideoBlack(threshold=0.1, min_duration_s=0.5, hysteresis=0.05)
    levels = [0] * 20 + [28] * 10 + [60]  # 28/255 = 0.11: above 0.1, below 0.15
    history = []
    for index, level in enumerate(levels):
        history += [
            (index, data["state"])
            for _, data in black.process(still(64, 36, level), meta_at(index))
        ]
    assert history == [(15, "start"), (30, "end")]


def test_black_run_broken_by_one_bright_frame_starts_over() -> None:
    # The pending run (1.5 s of black, under the 2 s minimum) must be forgotten at the
    # bright frame; were it kept, the second run would open an episode dated from the first.
    black = VideoBlack(min_duration_s=2.0)
    levels = [0] * 45 + [200] + [0] * 45 + [200]
    events = []
    for index, level in enumerate(levels):
        events += black.process(still(64, 36, level), meta_at(index))
    assert events == []
    assert black.luma > 0.5


def test_black_skipping_idle_frames_matches_every_frame_through_the_episode() -> None:
    # The analyzer skips Episode.update for a bright frame when nothing is pending or open.
    # Reference: the same frames, each through a plain Episode as the analyzer once did.
    rng = random.Random(20261206)
    levels = [0, 16, 26, 30, 60, 200]  # around the 0.1 threshold and its 0.12 hysteresis
    frames = {level: still(64, 36, level) for level in levels}
    black = VideoBlack(threshold=0.1, min_duration_s=0.3, hysteresis=0.02)
    reference = Episode(300)
    timestamp = 0
    for index in range(3000):
        level = rng.choice(levels) if rng.random() < 0.2 else (0 if index % 200 < 120 else 200)
        timestamp = 0 if rng.random() < 0.005 else timestamp + 3000  # a new sender clock
        meta = FrameMeta("video", "H264", index, timestamp, False, index / FPS, index / FPS)
        got = black.process(frames[level], meta)
        limit = 0.1 + (0.02 if reference.started else 0.0)
        at = timestamp / 90.0
        want = reference.update(black.luma < limit, at, at)
        if want is not None and want["state"] == "start":
            want["luma"] = round(black.luma, 4)
        assert got == ([] if want is None else [("video_black", want)]), index
        assert black.black == reference.started
    assert black.events > 10  # episodes opened and closed along the way


def test_episode_restarts_when_media_time_runs_backwards() -> None:
    episode = Episode(1000)
    assert episode.update(True, 5000, 5000) is None
    assert episode.update(True, 0, 0) is None  # a new sender clock
    assert episode.update(True, 900, 900) is None
    assert episode.update(True, 1000, 1000) == {"state": "start", "at_ms": 0}


def test_pixel_formats_other_than_yuv420p_are_measured(clips: dict[str, Path]) -> None:
    black = VideoBlack(min_duration_s=0.0)
    rgb = av.VideoFrame.from_ndarray(np.zeros((36, 64, 3), np.uint8), format="rgb24")
    assert [data["state"] for _, data in black.process(rgb, meta_at(0))] == ["start"]
    nv12 = still(64, 36, 200).reformat(format="nv12")
    assert [data["state"] for _, data in black.process(nv12, meta_at(1))] == ["end"]


def test_fixture_generation_is_deterministic(tmp_path: Path) -> None:
    name = "black_silence_360p.mp4"
    one = ensure(name, tmp_path / "a")
    two = ensure(name, tmp_path / "b")
    assert one.read_bytes() == two.read_bytes()
    mtime = one.stat().st_mtime_ns
    assert ensure(name, tmp_path / "a").stat().st_mtime_ns == mtime  # kept, not rebuilt
