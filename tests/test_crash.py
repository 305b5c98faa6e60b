"""Crash consistency: SIGKILL a real writer process at random points, reopen, verify.

The writer (``bench/support/crash_writer.py``) prints a line after each *confirmed* append; this
process reads those lines concurrently, kills the writer, reopens the same data dir and
checks that every confirmation is in the log exactly once, seqs are 1..N without gaps,
and exactly the runs left live got ``run_interrupted``. The randomness is seeded: set
``WHIP_CRASH_SEED`` to replay a failure's kill plans and workloads (the exact kill
instant still depends on timing).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path

import pytest

from bench.support.crash_writer import (
    Confirmed,
    LoopState,
    WriterProcess,
    parse_confirmed,
    run_iteration,
    segment_paths,
    verify_reopened,
    walk_frames,
)
from registry.events import EventType, NewEvent
from registry.record import encode_body, encode_frame
from registry.segments import segment_name
from registry.timeline import Timeline, TimelineConfig

KILL_ITERATIONS = 20
SMALL_SEGMENTS = 128 * 1024  # several rotations over the loop, so kills land near them


def master_seed() -> int:
    env = os.environ.get("WHIP_CRASH_SEED")
    return int(env) if env else random.SystemRandom().randrange(2**32)


def test_kill_loop_recovers_every_confirmed_append(tmp_path: Path) -> None:
    seed = master_seed()
    rng = random.Random(seed)
    state = LoopState(tmp_path / "data", segment_bytes=SMALL_SEGMENTS)
    history = []
    for iteration in range(KILL_ITERATIONS):
        iteration_seed = rng.randrange(2**32)
        try:
            history.append(run_iteration(state, iteration, iteration_seed))
        except AssertionError as exc:
            pytest.fail(
                f"kill iteration {iteration} failed (WHIP_CRASH_SEED={seed}, iteration seed "
                f"{iteration_seed}, data dir {state.data_dir}): {exc}",
                pytrace=True,
            )
    # The loop must have exercised something: confirmations, live runs, rotations.
    assert sum(s.confirmed for s in history) >= 10 * KILL_ITERATIONS, (seed, history)
    assert sum(s.interrupted for s in history) > 0, (seed, history)
    assert history[-1].segments > 1, (seed, history[-1])
    assert len(state.ledger) == sum(s.confirmed for s in history)


def _log_end(data_dir: Path) -> tuple[Path, bytes, int, int]:
    """(last segment, its bytes, where its valid frames end, the last valid seq)."""
    paths = segment_paths(data_dir)
    last_seq = 0
    for path in paths[:-1]:
        buf = path.read_bytes()
        frames, end = walk_frames(buf, last_seq + 1)
        assert end == len(buf), f"{path.name} is not intact up to its end"
        last_seq += len(frames)
    buf = paths[-1].read_bytes()
    frames, end = walk_frames(buf, last_seq + 1)
    return paths[-1], buf, end, last_seq + len(frames)


def _junk(kind: str, next_seq: int, rng: random.Random) -> bytes:
    # Big enough that the run_interrupted appends of the reopen cannot simply overwrite
    # it: junk left behind (not truncated) would then still be found after them.
    frame = encode_frame(
        next_seq,
        encode_body(NewEvent("torn-run", EventType.STATS, "p", {"pad": "t" * 50_000})),
    )
    if kind == "garbage":
        return rng.randbytes(rng.randint(20_000, 40_000))
    if kind == "partial_frame":
        return frame[: len(frame) // 2]
    if kind == "partial_header":
        return frame[:5]
    if kind == "zeros":  # a file extended by the crash but never written
        return bytes(rng.choice((4096, 32768)))
    if kind == "fresh_segment":  # rotated, then the first write into it was torn
        return frame[: rng.randint(1, len(frame) - 1)]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["garbage", "partial_frame", "partial_header", "zeros", "fresh_segment"]
)
def test_torn_tail_after_kill_is_truncated(tmp_path: Path, kind: str) -> None:
    seed = master_seed()
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    writer = WriterProcess(
        [str(data_dir), "--tag", "torn", "--seed", str(seed)], tmp_path / "writer.stderr"
    )
    try:
        assert writer.wait_lines(1 + rng.randint(30, 200), timeout=30), writer.stderr_tail()
    finally:
        writer.kill()
    assert writer.proc.returncode == -signal.SIGKILL
    _, confirmed = parse_confirmed(writer.lines)
    ledger = {c.marker: c for c in confirmed}

    segment, before, good_end, last_seq = _log_end(data_dir)
    junk = _junk(kind, last_seq + 1, rng)
    if kind == "fresh_segment":
        # The writer rotates only after intact writes: drop a torn write of the kill
        # ourselves, then tear the first write into the next segment.
        with open(segment, "r+b") as fh:
            fh.truncate(good_end)
        if good_end:
            segment = segment.with_name(segment_name(last_seq + 1))
        before = b""
        good_end = 0
    with open(segment, "ab") as fh:
        fh.write(junk)
    # The kill itself may have left a torn write; the reopen must cut both.
    expected_torn = len(before) + len(junk) - good_end

    config = TimelineConfig(data_dir)
    timeline = Timeline.open(config)
    try:
        report = timeline.recovery
        assert report is not None
        assert report.corruption is None, (seed, report.corruption)
        assert report.torn_tail_bytes == expected_torn > 0, seed
        assert report.last_seq == last_seq, seed
        # This also walks every segment: truncated, not merely skipped, means no junk is
        # left behind the run_interrupted appends of the reopen.
        events = verify_reopened(timeline, ledger, {c.run_id for c in confirmed})
        assert segment.read_bytes()[:good_end] == before[:good_end]
        seq = timeline.append_blocking(
            NewEvent("after-torn", EventType.RUN_CREATED, "p", {"marker": "after-torn"})
        )
        assert seq == len(events) + 1, seed
        assert [e.seq for e in timeline.read_run_events("after-torn")] == [seq]
    finally:
        timeline.close()

    again = Timeline.open(config)
    try:
        assert again.recovery is not None
        assert again.recovery.torn_tail_bytes == 0
        assert again.recovery.last_seq == seq
        assert again.interrupted == ["after-torn"]
        ledger["after-torn"] = Confirmed(seq, "after-torn", "run_created", "after-torn")
        verify_reopened(again, ledger)
    finally:
        again.close()


def test_preallocated_space_never_outlives_the_segment_being_written(tmp_path: Path) -> None:
    """The writer allocates the active segment ahead of its writes. Rotation and a clean
    close cut it back to the last frame; a crash leaves zeros that recovery truncates."""
    data_dir = tmp_path / "data"
    config = TimelineConfig(data_dir, segment_bytes=SMALL_SEGMENTS)
    timeline = Timeline.open(config)
    try:
        for i in range(1500):
            data = {"i": i, "pad": "x" * 200}
            timeline.append_blocking(NewEvent(f"run-{i % 7}", EventType.STATS, "p", data))
        segments = segment_paths(data_dir)
        assert len(segments) > 2
        for path in segments[:-1]:  # left behind by rotations: frames only
            frames, end = walk_frames(path.read_bytes(), int(path.stem))
            assert end == path.stat().st_size and frames
        active = segments[-1].read_bytes()
        _, end = walk_frames(active, int(segments[-1].stem))
        assert len(active) > end, "the active segment is allocated ahead"
        assert active.count(0, end) == len(active) - end
        # What a SIGKILL would leave on disk right now.
        crashed = tmp_path / "crashed"
        shutil.copytree(data_dir, crashed)
    finally:
        timeline.close()
    _, end = walk_frames(segments[-1].read_bytes(), int(segments[-1].stem))
    assert segments[-1].stat().st_size == end, "a clean close cuts the preallocation"

    again = Timeline.open(TimelineConfig(data_dir, segment_bytes=SMALL_SEGMENTS))
    try:
        assert again.recovery is not None and again.recovery.torn_tail_bytes == 0
    finally:
        again.close()
    after_crash = Timeline.open(TimelineConfig(crashed, segment_bytes=SMALL_SEGMENTS))
    try:
        report = after_crash.recovery
        assert report is not None
        assert report.corruption is None
        assert report.torn_tail_bytes == len(active) - end > 0
        assert report.last_seq == 1500
        assert [e.data["i"] for e in after_crash.wal.read_all()] == list(range(1500))
    finally:
        after_crash.close()
