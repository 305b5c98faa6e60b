"""The session recorder on its own: every recordable codec, both containers, rotation at a
size change, the bounded queue's keyframe-aware drops, the disk budget, and how much of
a cut fragmented MP4 is whole.

Frames come from real encoders (PyAV's libx264, libx265, libvpx, libvpx-vp9, libsvtav1,
libopus), in the form the depacketizer hands them over (Annex B for H.264/H.265, a
low-overhead temporal unit for AV1), flagged by the production keyframe detector.
"""

from __future__ import annotations

import fractions
import threading
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.frame import EncodedFrame
from pipeline.keyframes import is_keyframe
from pipeline.recording.codec_setup import opus_head, video_extradata
from pipeline.recording.fmp4 import complete_length
from pipeline.recording.recorder import RecorderSettings, SessionRecorder
from pipeline.recording.store import RecordingStore, SegmentEntry, segment_index
from registry.events import Event
from registry.runs import RunRegistry
from tests.support.eventually import eventually_blocking

FPS = 30
ENCODERS = {
    "H264": ("libx264", {"preset": "ultrafast", "tune": "zerolatency"}),
    "H265": ("libx265", {"preset": "ultrafast", "x265-params": "log-level=none"}),
    "VP8": ("libvpx", {"deadline": "realtime"}),
    "VP9": ("libvpx-vp9", {"deadline": "realtime", "cpu-used": "8"}),
    "AV1": ("libsvtav1", {"preset": "12"}),
}
FFMPEG_NAMES = {"H264": "h264", "H265": "hevc", "VP8": "vp8", "VP9": "vp9", "AV1": "av1"}


def encode_video(
    codec: str, frames: int, size: tuple[int, int], first: int = 0
) -> list[EncodedFrame]:
    """``frames`` frames of ``codec`` at ``size``, a keyframe every second, RTP times from
    ``first`` (frame index)."""
    name, options = ENCODERS[codec]
    encoder = av.CodecContext.create(name, "w")
    width, height = size
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
    encoder.time_base = fractions.Fraction(1, FPS)
    encoder.framerate = fractions.Fraction(FPS)
    encoder.gop_size = FPS
    encoder.max_b_frames = 0
    encoder.options = options
    out: list[EncodedFrame] = []
    pictures = [np.full((height, width, 3), (i * 7) % 256, dtype=np.uint8) for i in range(frames)]
    packets = []
    for index, image in enumerate(pictures):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index
        packets += encoder.encode(frame)
    packets += encoder.encode(None)
    for packet in packets:
        data = bytes(packet)
        index = first + int(packet.pts)
        out.append(
            EncodedFrame("video", codec, data, index * 3000, is_keyframe(codec, data), index / FPS)
        )
    return out


def encode_opus(seconds: float) -> list[EncodedFrame]:
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 48000, "stereo", "s16"
    encoder.time_base = fractions.Fraction(1, 48000)
    out: list[EncodedFrame] = []
    for index in range(int(seconds * 50)):
        block = av.AudioFrame.from_ndarray(
            np.zeros((1, 1920), dtype=np.int16), format="s16", layout="stereo"
        )
        block.sample_rate = 48000
        block.pts = index * 960
        for packet in encoder.encode(block):
            ts = int(packet.pts)
            out.append(EncodedFrame("audio", "opus", bytes(packet), ts, True, ts / 48000))
    return out


@dataclass
class Timeline:
    """The recorder's ``emit`` target: the events in order."""

    events: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, etype: str, data: dict[str, object]) -> None:
        with self.lock:
            self.events.append((etype, data))

    def of(self, etype: str) -> list[dict[str, object]]:
        return [d for t, d in self.events if t == etype]


def record(
    tmp_path: Path,
    frames: list[EncodedFrame],
    *,
    fmt: str = "fmp4",
    segment_s: float = 1.0,
    has_audio: bool = False,
) -> tuple[RecordingStore, Timeline, SessionRecorder]:
    store = RecordingStore(tmp_path / "recordings")
    timeline = Timeline()
    recorder = SessionRecorder(
        "r_test",
        "s_test",
        store,
        timeline.emit,
        settings=RecorderSettings(segment_s=segment_s, format=fmt),  # type: ignore[arg-type]
        has_video=any(f.kind == "video" for f in frames),
        has_audio=has_audio,
    )
    recorder.start()
    for frame in sorted(frames, key=lambda f: f.arrival):
        recorder.observe(frame, None)
    recorder.close()
    assert recorder.join(30)
    return store, timeline, recorder


def read(path: Path) -> tuple[str, tuple[int, int], int, int, bool]:
    """(codec, size, video packets, audio packets, first video packet is a keyframe)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        video = audio = 0
        first_key = False
        for packet in container.demux():
            if not packet.size:
                continue
            if packet.stream.type == "video":
                first_key = first_key or (video == 0 and packet.is_keyframe)
                video += 1
            else:
                audio += 1
        ctx = stream.codec_context
        return ctx.codec.canonical_name, (ctx.width, ctx.height), video, audio, first_key


@pytest.mark.parametrize(
    ("codec", "fmt"),
    [("H264", "mkv"), ("H265", "fmp4"), ("VP8", "mkv"), ("VP9", "fmp4"), ("AV1", "fmp4")],
)
def test_every_codec_is_recorded_in_segments_from_keyframes(
    tmp_path: Path, codec: str, fmt: str
) -> None:
    frames = encode_video(codec, 2 * FPS + 5, (128, 72))
    audio = encode_opus(2.0)
    store, timeline, recorder = record(tmp_path, frames + audio, fmt=fmt, has_audio=True)
    segments = timeline.of("recording_segment")
    assert timeline.of("recording_failed") == []
    assert [d["index"] for d in segments] == [0, 1, 2]  # keyframes at 0, 1 and 2 s
    extension = ".mp4" if fmt == "fmp4" else ".mkv"
    assert [e.name for e in store.segments("r_test")] == [f"{i}{extension}" for i in range(3)]
    total = 0
    for data in segments:
        name, size, video, audio_packets, first_key = read(
            store.run_dir("r_test") / str(data["name"])
        )
        assert (name, size, first_key) == (FFMPEG_NAMES[codec], (128, 72), True)
        assert (video, audio_packets) == (data["video_frames"], data["audio_frames"])
        total += video
    assert total == len(frames)
    assert [d["duration_ms"] for d in segments[:2]] == [1000, 1000]
    assert recorder.dropped_frames == 0


def test_a_size_change_at_a_keyframe_starts_a_segment(tmp_path: Path) -> None:
    """What a simulcast layer switch looks like: timestamps go on, the size changes."""
    big = encode_video("H264", 20, (160, 96))
    small = encode_video("H264", 20, (96, 64), first=20)
    store, timeline, _ = record(tmp_path, big + small, segment_s=60)
    segments = timeline.of("recording_segment")
    assert [(d["video_frames"], d["start_ms"]) for d in segments] == [(20, 0), (20, 667)]
    sizes = [read(store.run_dir("r_test") / str(d["name"]))[1] for d in segments]
    assert sizes == [(160, 96), (96, 64)]


def test_b_frames_keep_their_presentation_order(tmp_path: Path) -> None:
    """RTP gives presentation times in decode order (0, 3, 1, 2, ...): the segment's made
    decode times must play every frame once, in presentation order."""
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = 64, 64, "yuv420p"
    encoder.time_base = fractions.Fraction(1, FPS)
    encoder.gop_size = FPS
    encoder.max_b_frames = 2
    encoder.options = {"preset": "veryfast", "bframes": "2"}
    packets = []
    for index in range(2 * FPS):
        image = np.full((64, 64, 3), (index * 7) % 256, dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index
        packets += encoder.encode(frame)
    packets += encoder.encode(None)
    frames = [
        EncodedFrame("video", "H264", bytes(p), int(p.pts) * 3000, p.is_keyframe, n / FPS)
        for n, p in enumerate(packets)
    ]
    assert [f.timestamp // 3000 for f in frames[:4]] != [0, 1, 2, 3]  # really reordered
    store, timeline, _ = record(tmp_path, frames, segment_s=60)
    with av.open(str(store.run_dir("r_test") / "0.mp4")) as container:
        shown = [f.pts for f in container.decode(video=0)]
    assert len(shown) == 2 * FPS and shown == sorted(set(shown))
    assert timeline.of("recording_segment")[0]["video_frames"] == 2 * FPS


def test_a_full_queue_drops_video_to_the_next_keyframe(tmp_path: Path) -> None:
    frames = encode_video("H264", 2 * FPS, (64, 64))  # keyframes at 0 and 30
    store = RecordingStore(tmp_path / "recordings")
    timeline = Timeline()
    recorder = SessionRecorder(
        "r_test",
        "s_test",
        store,
        timeline.emit,
        settings=RecorderSettings(segment_s=60, max_frames=5),
        has_video=True,
        has_audio=False,
    )
    for frame in frames[:8]:  # the thread is not started: 5 fit, 3 are dropped
        recorder.observe(frame, None)
    recorder.start()
    eventually_blocking(lambda: recorder.queued == 0, within=10, awaiting="the queue drained")
    for frame in frames[8:]:  # 8..29 are dropped (no keyframe yet), 30.. fit again
        recorder.observe(frame, None)
        eventually_blocking(lambda: recorder.queued == 0, within=10, awaiting="drained")
    recorder.close()
    assert recorder.join(30)
    (segment,) = timeline.of("recording_segment")
    assert segment["video_frames"] == 5 + FPS
    assert segment["dropped_frames"] == recorder.dropped_frames == 3 + 22


def test_a_cut_fragmented_mp4_keeps_its_complete_fragments(tmp_path: Path) -> None:
    frames = encode_video("H264", 3 * FPS, (64, 64))
    store, _, _ = record(tmp_path, frames, segment_s=60)
    path = store.run_dir("r_test") / "0.mp4"
    data = path.read_bytes()
    assert complete_length(data) == len(data)
    decodable = []
    for cut in (100, len(data) // 3, len(data) // 2, len(data) - 1):
        whole = complete_length(data[:cut])
        assert whole <= cut
        if whole:
            part = tmp_path / f"cut{cut}.mp4"
            part.write_bytes(data[:whole])
            with av.open(str(part)) as container:
                decodable.append(sum(1 for _ in container.decode(video=0)))
    assert complete_length(data[:100]) == 0  # inside the header: nothing playable
    # More of the file, more frames; a cut in a fragment loses that fragment only.
    assert decodable == sorted(decodable) and decodable[-1] == 3 * FPS
    assert any(0 < n < 3 * FPS for n in decodable)


def test_the_budget_evicts_the_oldest_ended_runs_first(tmp_path: Path) -> None:
    runs = RunRegistry()
    seq = 0

    def apply(run_id: str, etype: str, ts_ms: int) -> None:
        nonlocal seq
        seq += 1
        runs.apply(Event(seq, run_id, etype, ts_ms, "p", {"stream": "s"}))

    for number, run_id in enumerate(("r_old", "r_mid", "r_live", "r_new")):
        apply(run_id, "run_created", 1000 * (number + 1))
        apply(run_id, "session_connected", 1000 * (number + 1))
    for run_id in ("r_old", "r_mid", "r_new"):
        apply(run_id, "session_closed", 9000)

    def order(run_id: str) -> tuple[bool, int] | None:
        view = runs.get(run_id)
        return None if view is None else (view.state == "ended", view.created_ms)

    store = RecordingStore(tmp_path, max_bytes=3000, run_order=order)
    for run_id in ("r_old", "r_mid", "r_live", "r_new"):
        store.run_dir(run_id).mkdir()
        (store.run_dir(run_id) / "0.mp4").write_bytes(b"x" * 1000)
        store.add(run_id, SegmentEntry("0.mp4", 1000, 1000))
    assert store.enforce_budget(live_run="r_live")
    assert sorted(store.run_ids()) == ["r_live", "r_mid", "r_new"]
    assert not store.run_dir("r_old").exists()
    store.max_bytes = 1000
    assert store.enforce_budget(live_run="r_live")  # r_mid, then r_new; never the live one
    assert store.run_ids() == ["r_live"] and store.total_bytes == 1000
    store.max_bytes = 500
    assert not store.enforce_budget(live_run="r_live")  # only a live run is left
    assert store.run_ids() == ["r_live"]


def test_names_and_parameters() -> None:
    assert [segment_index(n) for n in ("0.mp4", "12.mkv", "00.mp4", "1.mp4.x", "../0.mp4")] == [
        0,
        12,
        None,
        None,
        None,
    ]
    assert RecordingStore(Path("/r")).path("r_1", "..") is None
    head = opus_head()
    assert head[:8] == b"OpusHead" and len(head) == 19 and head[9] == 2
    sps_only = b"\x00\x00\x00\x01\x67\x42\xc0\x0d\xda"
    assert video_extradata("H264", sps_only) is None  # no PPS: wait for a better keyframe
    assert video_extradata("VP8", b"anything") == b""
