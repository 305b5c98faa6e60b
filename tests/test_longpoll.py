"""Long-poll: no lost wakeup, many waiters, timeouts, bad cursors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.errors import InvalidCursorError, UnknownRunError
from registry.events import NewEvent
from registry.timeline import Timeline


async def _open(factory: Callable[..., Timeline], path: Path) -> Timeline:
    return await asyncio.to_thread(factory, path)


async def test_100_waiters_all_wake_on_the_next_event(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    seq = await timeline.append(NewEvent("r", "run_created", "p"))
    waiters = [
        asyncio.create_task(timeline.wait_for_events("r", seq, wait_s=20)) for _ in range(100)
    ]
    # One loop turn runs each task up to its first real suspension: awaiting its future.
    await asyncio.sleep(0)
    assert timeline.waiters.waiting() == 100
    new_seq = await timeline.append(NewEvent("r", "stats", "p"))
    results = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert all([e.seq for e in r] == [new_seq] for r in results)
    assert timeline.waiters.waiting() == 0


async def test_an_event_appended_before_waiting_is_returned_at_once(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    seq = await timeline.append(NewEvent("r", "run_created", "p"))
    await timeline.append(NewEvent("r", "stats", "p"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await timeline.wait_for_events("r", seq, wait_s=30)
    assert [e.type for e in events] == ["stats"]
    assert loop.time() - started < 5  # not the 30 s wait: it returned without waiting


async def test_a_waiter_ignores_other_runs_and_times_out_empty(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    seq = await timeline.append(NewEvent("r", "run_created", "p"))
    waiter = asyncio.create_task(timeline.wait_for_events("r", seq, wait_s=0.3))
    await timeline.append(NewEvent("other", "run_created", "p"))
    assert await waiter == []
    assert timeline.waiters.waiting() == 0


async def test_a_cancelled_waiter_unregisters(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    seq = await timeline.append(NewEvent("r", "run_created", "p"))
    waiter = asyncio.create_task(timeline.wait_for_events("r", seq, wait_s=30))
    await asyncio.sleep(0)
    assert timeline.waiters.waiting() == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert timeline.waiters.waiting() == 0


@pytest.mark.parametrize(
    ("after", "limit"),
    [(-1, 10), (0, 0), (0, -5), (0, 1001), (2**63, 10), ("3", 10), (0, 2.5), (True, 1)],
)
async def test_bad_cursors_and_limits_are_clear_errors(
    tmp_path: Path, timeline_factory: Callable[..., Timeline], after: object, limit: object
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    await timeline.append(NewEvent("r", "run_created", "p"))
    with pytest.raises(InvalidCursorError) as info:
        await timeline.read_events("r", after, limit)  # type: ignore[arg-type]
    assert info.value.http_status == 400


async def test_bad_waits_and_unknown_runs(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await _open(timeline_factory, tmp_path / "d")
    await timeline.append(NewEvent("r", "run_created", "p"))
    for wait in (-1, 61, float("nan"), "5"):
        with pytest.raises(InvalidCursorError):
            await timeline.wait_for_events("r", 0, wait_s=wait)  # type: ignore[arg-type]
    with pytest.raises(UnknownRunError) as info:
        await timeline.read_events("nope", 0, 10)
    assert info.value.http_status == 404
    with pytest.raises(UnknownRunError):
        await timeline.wait_for_events("nope", 0, wait_s=1)
    # A huge but valid cursor is simply "nothing yet".
    assert await timeline.read_events("r", 2**63 - 1, 1000) == []
