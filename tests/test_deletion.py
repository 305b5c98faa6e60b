"""Single-winner deletion: exactly one run_deleted, everyone answered, rollback works."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.errors import AppendFailedError, NonBlockingDeleteError
from registry.events import NewEvent
from registry.runs import ClaimKind, DeleteState
from registry.timeline import Timeline
from tests.support.eventually import eventually


class FailingWrites:
    """Fault injection: the next ``armed`` batches fail their write (rolled back)."""

    def __init__(self) -> None:
        self.armed = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def before_write(self, first_seq: int, count: int) -> None:
        self.entered.set()
        self.release.wait(30)
        if self.armed > 0:
            self.armed -= 1
            raise OSError(5, "injected write failure")

    def before_fsync(self) -> None:
        return None


async def _open(factory: Callable[..., Timeline], path: Path, **kw: object) -> Timeline:
    return await asyncio.to_thread(factory, path, **kw)


async def _create(timeline: Timeline, run_id: str, principal: str = "alice") -> None:
    await timeline.append(NewEvent(run_id, "run_created", principal, {"stream": "s"}))


async def test_64_concurrent_deleters_one_run_deleted_all_answered(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    await _create(timeline, "r1")
    results = await asyncio.gather(*(timeline.delete_run("r1", "alice") for _ in range(64)))
    assert len(results) == 64
    outcomes = [r.outcome for r in results]
    assert outcomes.count(ClaimKind.CLAIMED) == 1
    assert outcomes.count(ClaimKind.ALREADY_DELETED) == 63
    winner = next(r for r in results if r.outcome is ClaimKind.CLAIMED)
    assert all(r.event.seq == winner.event.seq for r in results), "repeats must not get new seqs"
    assert all(r.synthesized for r in results if r is not winner)
    on_disk = await asyncio.to_thread(timeline.wal.read_all)
    assert [e.type for e in on_disk].count("run_deleted") == 1
    view = timeline.runs.get("r1")
    assert view is not None and view.state == "deleted"


async def test_an_injected_append_failure_rolls_back_to_live_and_the_next_delete_wins(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    faults = FailingWrites()
    timeline = await _open(timeline_factory, tmp_path / "d", faults=faults)
    await _create(timeline, "r1")
    faults.armed = 1
    faults.release.clear()
    faults.entered.clear()
    first = asyncio.create_task(timeline.delete_run("r1", "alice"))
    assert await asyncio.to_thread(faults.entered.wait, 10)
    # While the winner's append is stuck in flight, others must wait, not append.
    waiters = [asyncio.create_task(timeline.delete_run("r1", "alice")) for _ in range(10)]
    await eventually(
        lambda: timeline.runs.delete_waiters("r1") == 10,
        within=10,
        awaiting=lambda: f"10 deleters parked, {timeline.runs.delete_waiters('r1')} are",
    )
    assert not any(w.done() for w in waiters)
    faults.release.set()
    with pytest.raises(AppendFailedError):
        await first
    # Rolled back: one of the waiters re-claims and succeeds, the rest see it deleted.
    results = await asyncio.gather(*waiters)
    assert [r.outcome for r in results].count(ClaimKind.CLAIMED) == 1
    on_disk = await asyncio.to_thread(timeline.wal.read_all)
    assert [e.type for e in on_disk] == ["run_created", "run_deleted"]
    assert [e.seq for e in on_disk] == [1, 2], "the failed batch's seq must be reused"


async def test_a_failed_delete_leaves_the_run_live(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    faults = FailingWrites()
    timeline = await _open(timeline_factory, tmp_path / "d", faults=faults)
    await _create(timeline, "r1")
    faults.armed = 1
    with pytest.raises(AppendFailedError):
        await timeline.delete_run("r1", "alice")
    view = timeline.runs.get("r1")
    assert view is not None
    assert (view.delete_state, view.state) == (DeleteState.LIVE, "starting")
    result = await timeline.delete_run("r1", "alice")
    assert result.outcome is ClaimKind.CLAIMED


async def test_a_cancelled_winner_still_settles_and_waiters_progress(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    faults = FailingWrites()
    timeline = await _open(timeline_factory, tmp_path / "d", faults=faults)
    await _create(timeline, "r1")
    faults.release.clear()
    faults.entered.clear()
    winner = asyncio.create_task(timeline.delete_run("r1", "alice"))
    assert await asyncio.to_thread(faults.entered.wait, 10)
    waiter = asyncio.create_task(timeline.delete_run("r1", "alice"))
    await eventually(
        lambda: timeline.runs.delete_waiters("r1") == 1,
        within=10,
        awaiting="the deleter parked on the winner",
    )
    winner.cancel()
    faults.release.set()
    result = await asyncio.wait_for(waiter, 10)
    assert result.outcome is ClaimKind.ALREADY_DELETED
    with pytest.raises(asyncio.CancelledError):
        await winner


async def test_unknown_run_is_deleted_unconditionally_once(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    results = await asyncio.gather(*(timeline.delete_run("ghost", "bob") for _ in range(16)))
    assert [r.outcome for r in results].count(ClaimKind.MISSING) == 1
    on_disk = await asyncio.to_thread(timeline.wal.read_all)
    assert [(e.run_id, e.type) for e in on_disk] == [("ghost", "run_deleted")]


async def test_append_nowait_refuses_run_deleted(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    with pytest.raises(NonBlockingDeleteError):
        timeline.append_nowait(NewEvent("r1", "run_deleted", "alice"))


async def test_deleted_runs_fifo_evicts_oldest_but_never_pinned_runs(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d", deleted_retention=3)
    for i in range(5):
        await _create(timeline, f"r{i}")
    timeline.runs.pin("r0")
    assert timeline.runs.is_pinned("r0")
    for i in range(5):
        await timeline.delete_run(f"r{i}", "alice")
    # r0 is pinned (its workers can still emit): kept past the FIFO bound. r1, r2 evicted.
    assert "r0" in timeline.runs
    assert "r1" not in timeline.runs and "r2" not in timeline.runs
    assert all(f"r{i}" in timeline.runs for i in (3, 4))
    assert "r1" not in timeline.wal.index
    timeline.runs.unpin("r0")
    assert "r0" in timeline.runs, "still within the bound: nothing to evict yet"
    await _create(timeline, "r5")
    await timeline.delete_run("r5", "alice")
    assert "r0" not in timeline.runs, "once unpinned, the oldest deleted run goes first"
    assert timeline.runs.deleted_retained == 3
