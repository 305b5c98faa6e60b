"""FrameIntake: bounded, keyframe-aware, one producer and one worker thread."""

from __future__ import annotations

import threading

import pytest

from pipeline.frame import EncodedFrame
from pipeline.intake import FrameIntake, payload_limit_for
from tests.test_decoder import (
    H264,
    OPUS,
    TICKS_PER_FRAME,
    h264_frames,
    jitter,
)

# ---------------------------------------------------------------- FrameIntake


def _invariant(intake: FrameIntake) -> None:
    s = intake.stats()
    assert s.frames_in == s.delivered + s.dropped_frames + s.empty_frames + s.depth, s


def test_offer_turns_an_aiortc_frame_into_an_encoded_frame() -> None:
    intake = FrameIntake("video", depth=4, payload_limit=1 << 20)
    data = h264_frames()[0]
    assert intake.offer(H264, jitter(data, 3))
    frame = intake.get(timeout=0)
    assert isinstance(frame, EncodedFrame)
    assert (frame.kind, frame.codec, frame.data, frame.timestamp, frame.keyframe) == (
        "video",
        "H264",
        data,
        3 * TICKS_PER_FRAME,
        True,
    )
    assert frame.arrival > 0
    s = intake.stats()
    assert (s.frames_in, s.bytes_in, s.keyframes, s.delivered, s.depth) == (1, len(data), 1, 1, 0)


def test_full_queue_drops_to_the_next_keyframe_and_asks_once_per_episode() -> None:
    frames = h264_frames()
    requests: list[int] = []
    intake = FrameIntake(
        "video",
        depth=4,
        payload_limit=1 << 20,
        on_need_keyframe=lambda: requests.append(intake.frames_in),
    )
    queued = [intake.offer(H264, jitter(frames[i], i)) for i in range(10)]
    assert queued == [True] * 4 + [False] * 6
    assert requests == [5]  # one request for the whole episode
    assert (intake.depth, intake.max_depth) == (4, 4)
    # The consumer catches up, but inter frames still cannot be used: still dropped.
    assert [intake.get(0) is not None for _ in range(4)] == [True] * 4
    assert not any(intake.offer(H264, jitter(frames[i], i)) for i in range(10, 30))
    assert intake.offer(H264, jitter(frames[30], 30))  # the keyframe ends the episode
    assert intake.offer(H264, jitter(frames[31], 31))
    assert requests == [5]
    s = intake.stats()
    assert (s.dropped_frames, s.keyframe_requests, s.max_depth) == (26, 1, 4)
    assert s.dropped_bytes == sum(len(frames[i]) for i in range(4, 30))
    _invariant(intake)


def test_a_keyframe_lost_to_a_full_queue_asks_again() -> None:
    frames = h264_frames()
    requests: list[int] = []
    intake = FrameIntake(
        "video", depth=2, payload_limit=1 << 20, on_need_keyframe=lambda: requests.append(1)
    )
    queued = [intake.offer(H264, jitter(frames[i], i)) for i in range(1, 5)]
    assert queued == [True, True, False, False] and len(requests) == 1
    assert not intake.offer(H264, jitter(frames[30], 30))  # a keyframe, queue still full
    assert len(requests) == 2, "a sender that keys only on request must be asked again"
    intake.get(0), intake.get(0)
    assert not intake.offer(H264, jitter(frames[31], 31))
    assert intake.offer(H264, jitter(frames[60], 60))
    assert len(requests) == 2
    _invariant(intake)


def test_oversized_frames_are_dropped_and_start_an_episode() -> None:
    frames = h264_frames()
    requests: list[int] = []
    small, big = sorted((frames[0], frames[30], frames[60]), key=len)[::2]
    assert len(frames[1]) <= len(small) < len(big)
    intake = FrameIntake(
        "video", depth=8, payload_limit=len(big) - 1, on_need_keyframe=lambda: requests.append(1)
    )
    assert not intake.offer(H264, jitter(big, 0))  # this IDR is too large
    assert not intake.offer(H264, jitter(frames[1], 1))
    assert requests == [1]
    assert intake.offer(H264, jitter(small, 30))  # a smaller IDR fits
    assert (intake.dropped_frames, intake.dropped_bytes) == (2, len(big) + len(frames[1]))
    _invariant(intake)


def test_audio_drops_only_the_frame_and_never_asks() -> None:
    requests: list[int] = []
    intake = FrameIntake(
        "audio", depth=2, payload_limit=100, on_need_keyframe=lambda: requests.append(1)
    )
    results = [intake.offer(OPUS, jitter(bytes([0xFC, i]) * 10, i, 960)) for i in range(4)]
    assert results == [True, True, False, False]
    intake.get(0)
    assert intake.offer(OPUS, jitter(b"\xfc\x01" * 10, 5, 960))
    assert not intake.offer(OPUS, jitter(b"\xfc" * 101, 6, 960))  # over the payload limit
    assert requests == [] and intake.keyframes == 6
    _invariant(intake)


def test_empty_frames_never_reach_the_queue() -> None:
    intake = FrameIntake("video", depth=2, payload_limit=100)
    assert not intake.offer(H264, jitter(b"", 0))
    assert (intake.empty_frames, intake.dropped_frames, intake.depth) == (1, 0, 0)
    _invariant(intake)


def test_close_drain_and_discard_and_frames_after_close() -> None:
    frames = h264_frames()
    intake = FrameIntake("video", depth=8, payload_limit=1 << 20)
    for i in range(3):
        intake.offer(H264, jitter(frames[i], i))
    intake.close()  # drain: the worker still gets what is queued
    got = [intake.get(0) for _ in range(5)]
    assert [f.timestamp if f else None for f in got] == [0, 3000, 6000, None, None]
    assert not intake.offer(H264, jitter(frames[3], 3))

    other = FrameIntake("video", depth=8, payload_limit=1 << 20)
    for i in range(3):
        other.offer(H264, jitter(frames[i], i))
    other.close(drain=False)
    other.close()  # idempotent
    assert other.get(0) is None
    assert (other.dropped_frames, other.depth, other.closed) == (3, 0, True)
    _invariant(intake)
    _invariant(other)


def test_get_times_out_and_wakes_for_a_frame_or_the_end() -> None:
    intake = FrameIntake("video", depth=2, payload_limit=1 << 20)
    with pytest.raises(TimeoutError):
        intake.get(timeout=0.01)
    results: list[EncodedFrame | None] = []
    waiting = threading.Event()

    def consumer() -> None:
        waiting.set()
        results.append(intake.get(timeout=5))
        results.append(intake.get(timeout=5))

    thread = threading.Thread(target=consumer, name="intake-consumer")
    thread.start()
    waiting.wait(5)
    intake.offer(H264, jitter(h264_frames()[0], 0))
    intake.close()
    thread.join(5)
    assert [r is not None for r in results] == [True, False]


def test_request_keyframe_from_the_worker_is_made_on_the_next_offer() -> None:
    frames = h264_frames()
    requests: list[int] = []
    intake = FrameIntake(
        "video", depth=8, payload_limit=1 << 20, on_need_keyframe=lambda: requests.append(1)
    )
    thread = threading.Thread(target=intake.request_keyframe, name="worker-side")
    thread.start()
    thread.join(5)
    assert requests == []  # never called off the producer's thread
    assert not intake.offer(H264, jitter(frames[1], 1))
    assert requests == [1]
    intake.request_keyframe()  # already in an episode: nothing new
    assert intake.offer(H264, jitter(frames[30], 30))
    assert requests == [1]
    FrameIntake("audio", depth=1, payload_limit=10).request_keyframe()  # a no-op


def test_a_failing_keyframe_callback_does_not_reach_the_producer() -> None:
    def boom() -> None:
        raise RuntimeError("pli failed")

    intake = FrameIntake("video", depth=1, payload_limit=1 << 20, on_need_keyframe=boom)
    intake.offer(H264, jitter(h264_frames()[0], 0))
    assert not intake.offer(H264, jitter(h264_frames()[1], 1))
    assert intake.keyframe_requests == 1


def test_payload_limit_for_splits_the_permit() -> None:
    assert payload_limit_for(2 * 16 * 1024, tracks=2, depth=16) == 1024
    assert payload_limit_for(1000, tracks=3, depth=4) == 83
    with pytest.raises(ValueError):
        payload_limit_for(10, tracks=2, depth=16)
    with pytest.raises(ValueError):
        FrameIntake("data", depth=1, payload_limit=1)  # type: ignore[arg-type]
