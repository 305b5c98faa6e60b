"""Frame processor plug-ins and the composed :class:`pipeline.analysis.Analysis`.

Plug-in modules are written to a temporary directory put on ``sys.path`` for the test
session. The end-to-end tests feed a fixture clip's real encoded frames (H.264 as
Annex-B, Opus) through real intakes and a real :class:`Supervisor`, so the decode
workers call :meth:`Analysis.on_frame` exactly as in a live session.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from pipeline.analysis import Analysis, AnalysisSettings
from pipeline.decoder import FrameMeta
from pipeline.errors import PipelineError
from pipeline.examples.motion import MotionDetector
from pipeline.frame import EncodedFrame
from pipeline.intake import FrameIntake
from pipeline.keyframes import is_keyframe
from pipeline.processor import (
    MAX_EVENT_DATA_BYTES,
    ProcessorLoadError,
    ProcessorOutputError,
    check_events,
    load_processor,
)
from pipeline.supervisor import Supervisor
from tests.test_analyzers import audio_frames, clip_paths, meta_at, still, video_frames

PLUGINS = "whip_test_plugins"

PLUGIN_SOURCE = '''
import threading


class Counter:
    """Counts video frames; a ``frame_count`` event every 30th."""

    kinds = ("video",)

    def __init__(self):
        self.frames = 0

    def process(self, frame, meta):
        self.frames += 1
        if self.frames % 30 == 0:
            return [("frame_count", {"frames": self.frames, "codec": meta.codec})]
        return []


def make_counter():
    return Counter()


class Holder:
    @staticmethod
    def make():
        return Counter()


shared = Counter()
NOT_CALLABLE = 42


class NeedsArgs:
    def __init__(self, threshold):
        self.threshold = threshold

    def process(self, frame, meta):
        return []


def failing_factory():
    raise RuntimeError("no GPU here")


def makes_nothing_useful():
    return object()


class BadKinds:
    kinds = ("video", "subtitles")

    def process(self, frame, meta):
        return []


class Raises:
    kinds = ("video",)

    def process(self, frame, meta):
        raise RuntimeError("processor bug")


class Returns:
    def __init__(self):
        self.output = []

    def process(self, frame, meta):
        return self.output


class Recorder:
    """Both kinds; records (kind, thread name) and whether calls ever overlapped."""

    def __init__(self):
        self.seen = []
        self.busy = False
        self.overlapped = False

    def process(self, frame, meta):
        if self.busy:
            self.overlapped = True
        self.busy = True
        self.seen.append((meta.kind, threading.current_thread().name))
        self.busy = False
        return []
'''


@pytest.fixture(scope="session")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("plugins")
    (root / f"{PLUGINS}.py").write_text(textwrap.dedent(PLUGIN_SOURCE), encoding="utf-8")
    (root / "whip_test_broken_plugin.py").write_text(
        'raise RuntimeError("boom at import")\n', encoding="utf-8"
    )
    sys.path.insert(0, str(root))
    yield PLUGINS
    sys.path.remove(str(root))
    for name in (PLUGINS, "whip_test_broken_plugin"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="session")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return clip_paths(tmp_path_factory)


# ---------------------------------------------------------------- loading


def test_load_a_class_a_factory_a_dotted_factory_and_an_instance(plugins: str) -> None:
    one = load_processor(f"{plugins}:Counter")
    two = load_processor(f"{plugins}:Counter")
    assert type(one).__name__ == "Counter" and one is not two  # one instance per session
    assert type(load_processor(f"{plugins}:make_counter")).__name__ == "Counter"
    assert type(load_processor(f"{plugins}:Holder.make")).__name__ == "Counter"
    module = sys.modules[plugins]
    assert load_processor(f"{plugins}:shared") is module.shared  # an instance: as is
    example = load_processor("pipeline.examples.motion:MotionDetector")
    assert isinstance(example, MotionDetector)


@pytest.mark.parametrize(
    ("template", "problem", "cause"),
    [
        ("{p}", "not 'package.module:attribute'", None),
        ("{p}:", "not 'package.module:attribute'", None),
        ("{p}::Counter", "not 'package.module:attribute'", None),
        ("{p}:Counter()", "not 'package.module:attribute'", None),
        ("{p}:Missing", "no attribute 'Missing'", AttributeError),
        ("{p}:Holder.missing", "no attribute 'missing'", AttributeError),
        ("{p}:NOT_CALLABLE", "a int is neither a class, a factory nor a processor", None),
        ("{p}:NeedsArgs", "calling it with no arguments failed: TypeError", TypeError),
        ("{p}:failing_factory", "calling it with no arguments failed: RuntimeError", RuntimeError),
        ("{p}:makes_nothing_useful", "it made a object, which has no callable process()", None),
        ("{p}:BadKinds", "kinds ['subtitles', 'video'] not within ['audio', 'video']", None),
    ],
)
def test_load_errors_name_the_spec_and_the_problem(
    plugins: str, template: str, problem: str, cause: type[BaseException] | None
) -> None:
    spec = template.format(p=plugins)
    with pytest.raises(ProcessorLoadError) as caught:
        load_processor(spec)
    assert repr(spec) in str(caught.value)
    assert problem in str(caught.value)
    assert caught.value.spec == spec
    assert isinstance(caught.value, PipelineError)
    if cause is None:
        assert caught.value.__cause__ is None
    else:
        assert isinstance(caught.value.__cause__, cause)


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        ("whip_test_no_such_module:Thing", ModuleNotFoundError),
        ("whip_test_broken_plugin:Thing", RuntimeError),
    ],
)
def test_load_errors_for_modules_that_do_not_import(
    plugins: str, spec: str, cause: type[BaseException]
) -> None:
    with pytest.raises(ProcessorLoadError, match="cannot import") as caught:
        load_processor(spec)
    assert repr(spec) in str(caught.value)
    assert isinstance(caught.value.__cause__, cause)


# ---------------------------------------------------------------- output checks


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        (None, "must return an iterable"),
        ("stats", "must return an iterable"),
        ({"motion": {}}, "must return an iterable"),
        ([("motion",)], "must be an (event_type, data) pair"),
        (["motion"], "must be an (event_type, data) pair"),
        ([("Motion", {})], "is not [a-z][a-z0-9_]{0,63}"),
        ([("m" * 65, {})], "is not [a-z][a-z0-9_]{0,63}"),
        ([(7, {})], "is not [a-z][a-z0-9_]{0,63}"),
        ([("session_closed", {})], "written by the system"),
        ([("scene_change", {"score": 1})], "written by the system"),
        ([("motion", [1, 2])], "must be a JSON object"),
        ([("motion", {1: "x"})], "must be a JSON object"),
        ([("motion", {"score": float("nan")})], "is not JSON"),
        ([("motion", {"frame": object()})], "is not JSON"),
        ([("motion", {"blob": "x" * MAX_EVENT_DATA_BYTES})], "over 16384"),
    ],
)
def test_invalid_processor_output_raises(output: object, problem: str) -> None:
    with pytest.raises(ProcessorOutputError) as caught:
        check_events(output, "my.plugin")
    assert "my.plugin" in str(caught.value)
    assert problem in str(caught.value)


def test_valid_output_is_copied_to_plain_json() -> None:
    data: dict[str, Any] = {"score": 0.5, "box": (1, 2), "nested": {"ok": True}}
    events = check_events(iter([("motion", data), ["face_seen", {}]]), "p")
    data["nested"]["ok"] = False
    assert events == [
        ("motion", {"score": 0.5, "box": [1, 2], "nested": {"ok": True}}),
        ("face_seen", {}),
    ]


# ---------------------------------------------------------------- analysis, direct


def _collector() -> tuple[list[tuple[str, dict[str, object]]], Any]:
    events: list[tuple[str, dict[str, object]]] = []
    lock = threading.Lock()

    def emit(etype: str, data: dict[str, object]) -> None:
        with lock:
            events.append((etype, data))

    return events, emit


def test_a_raising_processor_propagates_out_of_on_frame(plugins: str) -> None:
    _, emit = _collector()
    analysis = Analysis(emit, run_id="r_1", processors=[load_processor(f"{plugins}:Raises")])
    with pytest.raises(RuntimeError, match="processor bug"):
        analysis.on_frame(still(64, 36, 100), meta_at(0, key=True))
    # Audio frames do not reach a video-only processor.
    tone = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.int16), format="s16", layout="mono")
    tone.sample_rate = 48000
    analysis.on_frame(tone, meta_at(0, kind="audio", codec="opus"))


def test_invalid_processor_output_propagates_out_of_on_frame(plugins: str) -> None:
    _, emit = _collector()
    returns = load_processor(f"{plugins}:Returns")
    analysis = Analysis(emit, run_id="r_1", processors=[returns])
    analysis.on_frame(still(64, 36, 100), meta_at(0, key=True))
    returns.output = [("stop_requested", {})]  # type: ignore[attr-defined]
    with pytest.raises(ProcessorOutputError, match="written by the system"):
        analysis.on_frame(still(64, 36, 100), meta_at(1))


def test_periodic_stats_nest_audio_and_processor_events_follow_the_analyzers(
    plugins: str, clips: dict[str, Path]
) -> None:
    events, emit = _collector()
    settings = AnalysisSettings(stats_interval_s=1.0, thumbnail_interval_s=0)
    counter = load_processor(f"{plugins}:Counter")
    analysis = Analysis(
        emit, run_id="r_1", settings=settings, processors=[counter], posted_at=-0.25
    )
    audio = list(audio_frames(clips["black_silence_360p.mp4"]))
    video = list(video_frames(clips["black_silence_360p.mp4"]))
    # Interleave by decode time, on one thread (the order two workers would roughly take).
    both: list[tuple[av.VideoFrame | av.AudioFrame, FrameMeta]] = [*audio, *video]
    merged = sorted(both, key=lambda pair: (pair[1].decoded_at, pair[1].kind))
    for frame, meta in merged:
        analysis.on_frame(frame, meta)
    types = [etype for etype, _ in events]
    assert types[0] == "first_frame"
    first = events[0][1]
    assert (first["codec"], first["width"], first["height"], first["ms_since_post"]) == (
        "H264",
        640,
        360,
        250,
    )
    detections = [
        (etype, data.get("state"), data.get("at_ms"))
        for etype, data in events
        if etype not in ("stats", "frame_count", "first_frame")
    ]
    # In decode-time order: a start is known min_duration (2 s) after it began.
    assert detections == [
        ("scene_change", None, 1000),
        ("video_black", "start", 1000),  # decided at 3.0 s
        ("audio_silence", "start", 1034),  # decided at 3.03 s
        ("audio_silence", "end", 3494),
        ("scene_change", None, 3500),
        ("video_black", "end", 3500),
    ]
    assert types.count("frame_count") == 5  # 150 video frames, one every 30th
    periodic = [data for etype, data in events if etype == "stats"]
    assert len(periodic) == 4  # 4.97 s of video at a 1 s interval
    for data in periodic:
        assert data["kind"] == "video" and data["fps"] == pytest.approx(30.0, abs=0.01)
        nested = data["audio"]
        assert isinstance(nested, dict)
        assert nested["codec"] == "opus" and nested["fps"] == pytest.approx(50.0, abs=0.5)
        assert isinstance(nested["level_dbfs"], float)
    final = analysis.final_stats()
    assert final["final"] is True
    assert (final["frames_decoded"], final["scene_changes"], final["thumbnails"]) == (150, 2, 0)
    assert isinstance(final["audio"], dict) and final["audio"]["frames_decoded"] == len(audio)
    assert analysis.close_episodes() == []
    assert analysis.video_stats.snapshot()["codec"] == "H264"
    assert analysis.track_rates("video")[0] == pytest.approx(30.0, abs=0.01)


def test_audio_only_session_leads_with_audio(clips: dict[str, Path]) -> None:
    events, emit = _collector()
    settings = AnalysisSettings(stats_interval_s=1.0)
    analysis = Analysis(emit, run_id="r_a", settings=settings, kinds=["audio"], posted_at=0.0)
    for frame, meta in audio_frames(clips["black_silence_360p.mp4"]):
        analysis.on_frame(frame, meta)
    assert events[0][0] == "first_frame" and events[0][1]["kind"] == "audio"
    assert [data["kind"] for etype, data in events if etype == "stats"] == ["audio"] * 4
    assert analysis.final_stats()["kind"] == "audio"
    assert analysis.latest_thumbnail() is None


def test_a_processor_for_both_kinds_is_called_one_thread_at_a_time(plugins: str) -> None:
    _, emit = _collector()
    recorder = load_processor(f"{plugins}:Recorder")
    analysis = Analysis(emit, run_id="r_1", processors=[recorder])
    tone = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.int16), format="s16", layout="mono")
    tone.sample_rate = 48000
    picture = still(64, 36, 100)
    start = threading.Barrier(2)

    def feed(kind: str) -> None:
        start.wait()
        for index in range(200):
            if kind == "video":
                analysis.on_frame(picture, meta_at(index))
            else:
                analysis.on_frame(tone, meta_at(index, kind="audio", codec="opus"))

    threads = [
        threading.Thread(target=feed, args=(k,), name=f"feed-{k}") for k in ("video", "audio")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    seen = recorder.seen  # type: ignore[attr-defined]
    assert sorted({(kind, name) for kind, name in seen}) == [
        ("audio", "feed-audio"),
        ("video", "feed-video"),
    ]
    assert len(seen) == 400
    assert recorder.overlapped is False  # type: ignore[attr-defined]


def test_motion_example_reports_start_and_stop(clips: dict[str, Path]) -> None:
    motion = MotionDetector()
    history = []
    for frame, meta in video_frames(clips["black_silence_360p.mp4"]):
        history += [(data["state"], data["at_ms"]) for _, data in motion.process(frame, meta)]
    # The pattern moves, goes black at 1.0 s (a still picture), moves again at 3.5 s.
    assert history == [("start", 500), ("stop", 1500), ("start", 3500)]
    assert check_events(motion.process(*next(video_frames(clips["pattern_720p.mp4"]))), "m") == []


# ---------------------------------------------------------------- end to end


def encoded_frames(path: Path) -> tuple[list[EncodedFrame], list[EncodedFrame]]:
    """The clip's video (Annex-B, 90 kHz) and audio (Opus, 48 kHz) as the intake gets them."""
    video: list[EncodedFrame] = []
    audio: list[EncodedFrame] = []
    with av.open(str(path)) as container:
        vstream = container.streams.video[0]
        annexb = av.BitStreamFilterContext("h264_mp4toannexb", vstream)
        for packet in container.demux():
            if packet.size == 0 or packet.pts is None or packet.time_base is None:
                continue
            if packet.stream is vstream:
                for out in annexb.filter(packet):
                    data = bytes(out)
                    assert out.pts is not None and out.time_base is not None
                    ts = round(out.pts * out.time_base * 90000)
                    video.append(
                        EncodedFrame("video", "H264", data, ts, is_keyframe("H264", data), 0.0)
                    )
            else:
                ts = max(0, round(packet.pts * packet.time_base * 48000))
                audio.append(EncodedFrame("audio", "opus", bytes(packet), ts, True, 0.0))
    return video, audio


Faults = list[tuple[str, BaseException]]


async def _run(
    analysis: Analysis, clip: Path, *, keyframes_only: bool = False
) -> tuple[Supervisor, Faults]:
    """Decode ``clip`` through a real runtime into ``analysis``; the faults reported.

    The intakes are filled and closed (drained) before the workers start, so the
    workers decode the whole clip, then see end of stream."""
    faults: Faults = []

    def on_fault(stage: str, exc: BaseException) -> None:
        faults.append((stage, exc))

    runtime = Supervisor(
        "s_test",
        loop=asyncio.get_running_loop(),
        on_fault=on_fault,
        on_frame=analysis.on_frame,
        keyframes_only=keyframes_only,
    )
    analysis.bind_supervisor(runtime)
    video, audio = encoded_frames(clip)
    intakes = [
        FrameIntake("video", depth=512, payload_limit=1 << 20),
        FrameIntake("audio", depth=512, payload_limit=1 << 16),
    ]
    for frame in video:
        assert intakes[0].put(frame)
    for frame in audio:
        assert intakes[1].put(frame)
    for intake in intakes:
        intake.close(drain=True)
    runtime.start(intakes)
    # Join the threads (not just ``done``): a worker reports its exit after ``done``.
    for worker in runtime.workers:
        assert worker.thread is not None
        await asyncio.to_thread(worker.thread.join, 10)
    assert await runtime.stop_async(2.0) == []
    return runtime, faults


async def test_end_to_end_through_the_decode_workers(
    clips: dict[str, Path], tmp_path: Path
) -> None:
    events, emit = _collector()
    settings = AnalysisSettings(thumbnail_interval_s=60)
    analysis = Analysis(
        emit,
        run_id="r_e2e",
        settings=settings,
        processors=[MotionDetector()],
        thumbnail_dir=tmp_path,
        posted_at=0.0,
    )
    runtime, faults = await _run(analysis, clips["black_silence_360p.mp4"])
    assert faults == []
    kinds = [etype for etype, _ in events if etype not in ("stats", "motion")]
    video_events = [e for e in kinds if e != "audio_silence"]
    assert video_events == [
        "first_frame",
        "scene_change",
        "video_black",
        "scene_change",
        "video_black",
    ]
    assert kinds.count("audio_silence") == 2
    final = analysis.final_stats()
    assert (final["codec"], final["width"], final["height"]) == ("H264", 640, 360)
    assert (final["frames_in"], final["frames_decoded"], final["keyframes"]) == (150, 150, 5)
    assert final["frames_dropped"] == 0 and final["decode_errors"] == 0
    assert isinstance(final["bytes_in"], int) and final["bytes_in"] > 0
    audio = final["audio"]
    assert isinstance(audio, dict) and audio["codec"] == "opus"
    assert audio["frames_in"] == audio["frames_decoded"] == 251  # 5 s of 20 ms + pre-skip
    jpeg = (tmp_path / "r_e2e.jpg").read_bytes()
    assert jpeg[:2] == b"\xff\xd8" and jpeg == analysis.latest_thumbnail()
    assert runtime.faults == []


async def test_keyframes_only_still_counts_every_encoded_frame(clips: dict[str, Path]) -> None:
    _, emit = _collector()
    analysis = Analysis(
        emit,
        run_id="r_kf",
        settings=AnalysisSettings(keyframes_only=True),
        kinds=["video", "audio"],
    )
    await _run(analysis, clips["two_scenes_360p.mp4"], keyframes_only=True)
    final = analysis.final_stats()
    assert (final["frames_in"], final["frames_decoded"], final["keyframes"]) == (180, 6, 6)
    assert final["frames_skipped"] == 174


async def test_a_raising_processor_faults_the_worker(plugins: str, clips: dict[str, Path]) -> None:
    _, emit = _collector()
    analysis = Analysis(emit, run_id="r_f", processors=[load_processor(f"{plugins}:Raises")])
    runtime, faults = await _run(analysis, clips["two_scenes_360p.mp4"])
    assert [(stage, str(exc)) for stage, exc in faults] == [("decode-video", "processor bug")]
    assert [stage for stage, _ in runtime.faults] == ["decode-video"]
