"""Following the WAL from outside the writer (registry/log_follower.py): exactly the
durable prefix is indexed, across segment rotations and chunk boundaries, and reads
answer what the timeline itself answers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.events import Event, NewEvent
from registry.log_follower import LogFollower, LogFollowError
from registry.timeline import Timeline

RUNS = ("r-a", "r-b", "r-c", "r-d")


def expected(events: list[Event], run_id: str, upto: int) -> list[Event]:
    return [e for e in events if e.run_id == run_id and e.seq <= upto]


async def append_batches(timeline: Timeline, rng: random.Random, count: int) -> None:
    """``count`` events of mixed sizes (some many times a small chunk), in concurrent
    batches, so several share one group commit."""
    for start in range(0, count, 16):
        await asyncio.gather(
            *(
                timeline.append(
                    NewEvent(
                        rng.choice(RUNS),
                        rng.choice(("stats", "stream_warning", "first_frame")),
                        "p",
                        {"n": n, "pad": "x" * rng.choice((0, 10, 300, 5_000))},
                    )
                )
                for n in range(start, min(count, start + 16))
            )
        )


@pytest.mark.parametrize("read_chunk", [64, 4096, 256 * 1024])
async def test_exactly_the_durable_prefix_is_indexed_across_segments_and_chunks(
    read_chunk: int, timeline_factory: Callable[..., Timeline]
) -> None:
    rng = random.Random(read_chunk)
    timeline = await asyncio.to_thread(timeline_factory, segment_bytes=16 * 1024)
    wal_dir = timeline.config.data_dir / "wal"
    follower = LogFollower(wal_dir, timeline.config.max_record_bytes, read_chunk=read_chunk)
    try:
        for _ in range(6):
            await append_batches(timeline, rng, 40)
            before = follower.last_seq
            upto = rng.randint(before, timeline.durable_seq)
            touched = follower.catch_up(upto)
            events = timeline.wal.read_all()
            assert follower.last_seq == upto
            assert touched == {e.run_id for e in events if before < e.seq <= upto}
            for run_id in RUNS:
                assert follower.read(run_id, 0, 1000) == expected(events, run_id, upto)
            assert follower.runs_after(0) == {e.run_id for e in events if e.seq <= upto}
        segments = list((timeline.config.data_dir / "wal").glob("*.wal"))
        assert len(segments) > 3, "the log rotated: the follower crossed segments"
        follower.catch_up(timeline.durable_seq)
        events = timeline.wal.read_all()
        for run_id in RUNS:
            after = rng.randint(0, timeline.durable_seq)
            want = [e for e in expected(events, run_id, timeline.durable_seq) if e.seq > after]
            assert follower.read(run_id, after, 7) == want[:7]
    finally:
        follower.close()


async def test_a_log_from_before_the_follower_and_a_garbage_tail_past_the_durable_seq(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    data = tmp_path / "data"
    timeline = await asyncio.to_thread(timeline_factory, data, segment_bytes=8 * 1024)
    await append_batches(timeline, random.Random(1), 60)
    durable = timeline.durable_seq
    events = timeline.wal.read_all()
    await asyncio.to_thread(timeline.close)
    last = sorted((data / "wal").glob("*.wal"))[-1]
    with last.open("ab") as tail:  # a torn write past the durable seq: never read
        tail.write(b"\x7f" * 3000)
    follower = LogFollower(data / "wal", timeline.config.max_record_bytes, read_chunk=512)
    try:
        assert follower.catch_up(durable) == {e.run_id for e in events}
        assert follower.last_seq == durable
        for run_id in RUNS:
            assert follower.read(run_id, 0, 1000) == expected(events, run_id, durable)
        with pytest.raises(LogFollowError, match=f"seq {durable + 1} is durable"):
            follower.catch_up(durable + 1)
        assert follower.last_seq == durable  # what was indexed stays readable
        assert follower.read("r-a", 0, 1000) == expected(events, "r-a", durable)
    finally:
        follower.close()


def test_an_empty_or_missing_log(tmp_path: Path) -> None:
    follower = LogFollower(tmp_path / "none", 64 * 1024)
    assert follower.catch_up(0) == set() and follower.last_seq == 0
    assert follower.read("r", 0, 10) == [] and follower.runs_after(0) == set()
    with pytest.raises(LogFollowError):
        follower.catch_up(1)
    follower.close()


async def test_passed_idle_runs_leave_the_index_and_a_later_event_comes_back_alone(
    timeline_factory: Callable[..., Timeline],
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    await append_batches(timeline, random.Random(2), 40)
    wal_dir = timeline.config.data_dir / "wal"
    follower = LogFollower(wal_dir, timeline.config.max_record_bytes)
    try:
        follower.catch_up(timeline.durable_seq)
        events = timeline.wal.read_all()
        last = {run: max(e.seq for e in events if e.run_id == run) for run in RUNS}
        newest_ts = max(e.ts_ms for e in events)
        keep = max(RUNS, key=lambda run: last[run])  # the run with the log's last event
        # idle, but not passed: the cursor is below the newest run's last seq
        assert follower.forget_passed(last[keep] - 1, newest_ts + 1) == len(RUNS) - 1
        assert follower.runs_after(0) == {keep}
        # passed, but not idle long enough: kept
        assert follower.forget_passed(timeline.durable_seq, 0) == 0
        assert follower.forget_passed(timeline.durable_seq, newest_ts + 1) == 1
        assert follower.runs_after(0) == set() and follower.read(keep, 0, 10) == []
        seq = await timeline.append(NewEvent("r-a", "stream_warning", "p", {"again": 1}))
        assert follower.catch_up(seq) == {"r-a"}
        (again,) = follower.read("r-a", 0, 10)
        assert again.seq == seq and again.data == {"again": 1}
    finally:
        follower.close()


async def test_warm_tails_answer_what_the_file_does_with_one_object_per_event(
    timeline_factory: Callable[..., Timeline],
) -> None:
    rng = random.Random(3)
    timeline = await asyncio.to_thread(timeline_factory)
    await append_batches(timeline, rng, 30)
    wal_dir = timeline.config.data_dir / "wal"
    max_record = timeline.config.max_record_bytes
    warm = LogFollower(wal_dir, max_record, tail_events=5, warm_runs=2)
    cold = LogFollower(wal_dir, max_record, tail_events=0)
    try:
        warm.catch_up(timeline.durable_seq, warm=False)  # a start: no tails
        for _ in range(8):
            await append_batches(timeline, rng, 12)
            upto = timeline.durable_seq
            assert warm.catch_up(upto) == cold.catch_up(upto)
            for run_id in RUNS:
                count = len(cold.read(run_id, 0, 1000))
                for after in {0, *(e.seq for e in cold.read(run_id, 0, 1000))}:
                    for limit in (1, 3, 1000):
                        assert warm.read(run_id, after, limit) == cold.read(run_id, after, limit)
                assert len(warm.read(run_id, 0, 1000)) == count
        # a run appended to last is warm: its newest events are shared objects
        for n in range(3):
            await timeline.append(NewEvent("r-b", "stats", "p", {"last": n}))
        warm.catch_up(timeline.durable_seq)
        cold.catch_up(timeline.durable_seq)
        events = cold.read("r-b", 0, 1000)
        two, one = warm.read("r-b", events[-3].seq, 10), warm.read("r-b", events[-2].seq, 10)
        assert two == events[-2:] and one == events[-1:] and one[0] is two[1]
        again, other = cold.read("r-b", events[-2].seq, 10), cold.read("r-b", events[-2].seq, 1)
        assert again == other and again[0] is not other[0]  # a file read decodes anew
    finally:
        warm.close()
        cold.close()
