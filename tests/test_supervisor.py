"""Supervisor: the worker generation of one session, on real encoded media.

Frames come from PyAV's libx264/libopus encoders (``tests/test_decoder.py`` helpers) and
go through the production FrameIntake and decoder_worker; slow or failing analyzers are
``on_frame`` callbacks that block on an event or raise.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.errors import SupervisorStateError
from pipeline.intake import FrameIntake
from pipeline.supervisor import Supervisor, SupervisorState
from tests.support.eventually import eventually
from tests.test_decoder import (
    FRAMES,
    H264,
    HEIGHT,
    OPUS,
    TICKS_PER_FRAME,
    WIDTH,
    Recorder,
    h264_frames,
    jitter,
    needs_libopus,
    needs_libx264,
    opus_frames,
)

pytestmark = needs_libx264


def _video(depth: int = FRAMES, **kwargs: object) -> FrameIntake:
    return FrameIntake("video", depth=depth, payload_limit=1 << 20, **kwargs)  # type: ignore[arg-type]


class Faults:
    """``on_fault`` recorder; ``seen`` is set on the loop when the first one arrives."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException, str]] = []
        self.seen = asyncio.Event()

    def __call__(self, stage: str, exc: BaseException) -> None:
        self.calls.append((stage, exc, threading.current_thread().name))
        self.seen.set()


async def test_frames_fed_on_the_loop_decode_in_a_named_stage_thread() -> None:
    loop = asyncio.get_running_loop()
    recorder = Recorder()
    faults = Faults()
    runtime = Supervisor("s1", loop=loop, on_fault=faults, on_frame=recorder)
    intake = _video()
    runtime.start([intake])
    assert [w.name for w in runtime.workers] == ["decode-video-s1"]
    assert runtime.workers[0].thread is not None and runtime.workers[0].thread.daemon
    for index, data in enumerate(h264_frames()):
        intake.offer(H264, jitter(data, index))
    await asyncio.to_thread(recorder.wait_for, FRAMES)
    assert await runtime.stop_async(2.0) == []
    stats = runtime.stats()["decode-video"]
    assert (stats.frames_decoded, stats.decode_errors, stats.width, stats.height) == (
        FRAMES,
        0,
        WIDTH,
        HEIGHT,
    )
    assert runtime.state_history == [
        SupervisorState.NEW,
        SupervisorState.RUNNING,
        SupervisorState.STOPPED,
    ]
    assert faults.calls == [] and runtime.faults == [] and runtime.detached == []


async def test_a_slow_consumer_drops_to_a_keyframe_and_resumes_cleanly() -> None:
    loop = asyncio.get_running_loop()
    frames = h264_frames()
    recorder = Recorder(block=True)  # the analyzer stalls on the first frame
    requests: list[int] = []
    intake = _video(depth=4, on_need_keyframe=lambda: requests.append(intake.frames_in))
    runtime = Supervisor("s2", loop=loop, on_frame=recorder)
    runtime.start([intake])
    intake.offer(H264, jitter(frames[0], 0))
    assert await asyncio.to_thread(recorder.entered.wait, 5)  # the worker holds frame 0
    depths = []
    for index in range(1, 36):
        intake.offer(H264, jitter(frames[index], index))
        depths.append(intake.depth)
    assert max(depths) == 4 and intake.max_depth == 4  # memory bounded by the depth
    assert intake.dropped_frames == 35 - 4  # 5..35, including the IDR at 30
    assert len(requests) == 2  # the episode at 5, again when the IDR at 30 was lost

    recorder.gate.set()
    await asyncio.to_thread(recorder.wait_for, 5)  # 0 and the queued 1..4
    for index in range(36, FRAMES):  # lock-step: never more than one frame queued
        queued = intake.offer(H264, jitter(frames[index], index))
        assert queued == (index >= 60), index
        if queued:
            await asyncio.to_thread(recorder.wait_for, 5 + index - 59)
    assert await runtime.stop_async(2.0) == []

    decoded = recorder.timestamps()
    assert decoded == [i * TICKS_PER_FRAME for i in (*range(5), *range(60, FRAMES))]
    assert recorder.metas[5].keyframe, "decoding resumes at a keyframe"
    stats = runtime.stats()["decode-video"]
    assert (stats.decode_errors, stats.skipped) == (0, 0)
    assert intake.dropped_frames == 35 - 4 + 24  # and 36..59 while waiting for the IDR
    assert len(requests) == 2


@needs_libopus
async def test_the_first_worker_failure_is_reported_once_with_its_stage() -> None:
    loop = asyncio.get_running_loop()
    faults = Faults()
    recorder = Recorder(raise_on=3)  # every track's analyzer fails on its 4th frame
    runtime = Supervisor("s3", loop=loop, on_fault=faults, on_frame=recorder)
    video = _video()
    audio = FrameIntake("audio", depth=64, payload_limit=4096)
    runtime.start([video, audio])
    assert [w.stage for w in runtime.workers] == ["decode-video", "decode-audio"]
    for index, data in enumerate(h264_frames()[:10]):
        video.offer(H264, jitter(data, index))
    for index, data in enumerate(opus_frames()[:10]):
        audio.offer(OPUS, jitter(data, index, 960))
    async with asyncio.timeout(5):
        await faults.seen.wait()
    # Both workers fail; their exits are posted before stop_async's wait returns.
    await asyncio.to_thread(lambda: all(w.done.wait(5) for w in runtime.workers))
    assert await runtime.stop_async(2.0) == []
    assert len(faults.calls) == 1
    stage, exc, thread = faults.calls[0]
    assert stage in ("decode-video", "decode-audio") and isinstance(exc, ValueError)
    assert thread == threading.current_thread().name  # delivered on the loop thread
    assert sorted(s for s, _ in runtime.faults) == ["decode-audio", "decode-video"]
    assert video.closed and audio.closed  # a dead worker's queue is released
    assert video.depth == audio.depth == 0


async def test_an_exception_after_stop_is_recorded_but_not_a_fault() -> None:
    loop = asyncio.get_running_loop()
    faults = Faults()
    recorder = Recorder(block=True, raise_on=0)
    runtime = Supervisor("s4", loop=loop, on_fault=faults, on_frame=recorder)
    intake = _video()
    runtime.start([intake])
    intake.offer(H264, jitter(h264_frames()[0], 0))
    assert await asyncio.to_thread(recorder.entered.wait, 5)
    assert await runtime.stop_async(0.05) == ["decode-video-s4"]
    recorder.gate.set()  # the analyzer wakes up and fails during the stop
    assert await runtime.stop_async(2.0) == []
    assert [s for s, _ in runtime.faults] == ["decode-video"] and faults.calls == []


async def test_a_worker_that_hangs_past_the_deadline_is_reported() -> None:
    loop = asyncio.get_running_loop()
    recorder = Recorder(block=True)
    runtime = Supervisor("s5", loop=loop, on_frame=recorder)
    intake = _video()
    runtime.start([intake])
    for index, data in enumerate(h264_frames()[:8]):
        intake.offer(H264, jitter(data, index))
    assert await asyncio.to_thread(recorder.entered.wait, 5)
    started = loop.time()
    assert await runtime.stop_async(0.2) == ["decode-video-s5"]
    assert 0.15 < loop.time() - started < 1.5
    assert runtime.detached == ["decode-video-s5"]
    assert runtime.state is SupervisorState.STOPPED
    assert intake.depth == 0 and intake.dropped_frames == 7  # queued frames discarded
    # The blocking flavour, from a thread, says the same.
    assert await asyncio.to_thread(runtime.stop, 0.1) == ["decode-video-s5"]

    recorder.gate.set()  # the detached worker finishes its frame and sees end of stream
    assert await asyncio.to_thread(runtime.stop, 5.0) == []
    assert runtime.detached == [] and runtime.faults == []
    assert len(recorder.metas) == 1


async def test_a_draining_stop_decodes_every_queued_frame() -> None:
    """A clean end (the peer is gone) decodes what already arrived: the worker, held on
    frame 0 while the rest queue up, is released after the stop began and still gets
    every frame; nothing is dropped."""
    loop = asyncio.get_running_loop()
    recorder = Recorder(block=True)
    runtime = Supervisor("s8", loop=loop, on_frame=recorder)
    intake = _video()
    runtime.start([intake])
    for index, data in enumerate(h264_frames()):
        intake.offer(H264, jitter(data, index))
    assert await asyncio.to_thread(recorder.entered.wait, 5)
    stop = asyncio.ensure_future(runtime.stop_async(10.0, drain_s=5.0))
    await eventually(  # the stop began: the intake is closed, its queue kept for the drain
        lambda: runtime.state is SupervisorState.STOPPED and intake.closed,
        within=5,
        awaiting="the stop requested",
    )
    assert not stop.done() and intake.depth == FRAMES - 1  # draining, nothing discarded
    recorder.gate.set()
    assert await stop == []
    assert len(recorder.metas) == FRAMES and intake.dropped_frames == 0
    assert runtime.stats()["decode-video"].frames_decoded == FRAMES


async def test_a_drain_that_runs_out_discards_the_rest_without_a_forced_shutdown() -> None:
    """The drain is bounded: when it runs out, the queued frames are discarded (counted
    as dropped) and a worker that then exits in time is not a forced shutdown."""
    loop = asyncio.get_running_loop()
    recorder = Recorder(block=True)
    runtime = Supervisor("s9", loop=loop, on_frame=recorder)
    intake = _video()
    runtime.start([intake])
    for index, data in enumerate(h264_frames()[:8]):
        intake.offer(H264, jitter(data, index))
    assert await asyncio.to_thread(recorder.entered.wait, 5)
    loop.call_later(0.4, recorder.gate.set)  # after the drain (0.2 s), within the deadline
    started = loop.time()
    assert await runtime.stop_async(5.0, drain_s=0.2) == []
    assert loop.time() - started < 4.0
    assert intake.dropped_frames == 7 and len(recorder.metas) == 1
    assert runtime.detached == []


async def test_a_partial_start_stops_what_started_and_re_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("decode-audio"):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    faults = Faults()
    runtime = Supervisor("s6", loop=loop, on_fault=faults)
    video = _video()
    audio = FrameIntake("audio", depth=4, payload_limit=4096)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        runtime.start([video, audio])
    monkeypatch.undo()
    assert [w.name for w in runtime.workers] == ["decode-video-s6"]
    assert runtime.workers[0].done.is_set()  # joined within the bounded start join
    assert runtime.detached == [] and video.closed and audio.closed is False
    assert runtime.state_history == [
        SupervisorState.NEW,
        SupervisorState.RUNNING,
        SupervisorState.STOPPED,
    ]
    with pytest.raises(SupervisorStateError):
        runtime.start([_video()])
    await runtime.stop_async(1.0)
    assert faults.calls == []


async def test_start_refuses_more_tracks_than_the_permit_has_workers() -> None:
    loop = asyncio.get_running_loop()
    runtime = Supervisor("s7", loop=loop, max_workers=1)
    with pytest.raises(ValueError, match="permit has 1"):
        runtime.start([_video(), FrameIntake("audio", depth=1, payload_limit=10)])
    assert runtime.workers == () and runtime.state is SupervisorState.NEW
    assert await runtime.stop_async(1.0) == []  # stopping a runtime that never ran
    assert runtime.state_history == [SupervisorState.NEW, SupervisorState.STOPPED]
    with pytest.raises(SupervisorStateError):
        runtime.start([_video()])


async def test_an_aiortc_end_of_stream_is_a_clean_exit() -> None:
    """The peer went away: the tap closes the intake (drain); no fault, all decoded."""
    loop = asyncio.get_running_loop()
    faults = Faults()
    recorder = Recorder()
    runtime = Supervisor("s8", loop=loop, on_fault=faults, on_frame=recorder)
    intake = _video()
    runtime.start([intake])
    for index, data in enumerate(h264_frames()[:20]):
        intake.offer(H264, jitter(data, index))
    intake.close()
    await asyncio.to_thread(lambda: runtime.workers[0].done.wait(5))
    assert len(recorder.metas) == 20 and runtime.detached == []
    assert await runtime.stop_async(1.0) == [] and faults.calls == [] and runtime.faults == []
