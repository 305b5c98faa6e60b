"""Errors of the timeline: who is at fault, and what state is left behind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.errors import (
    DataDirLockedError,
    EventTooLargeError,
    TimelineBrokenError,
    TimelineClosedError,
)
from registry.events import NewEvent
from registry.timeline import Timeline, TimelineConfig


class FailingFsync:
    def __init__(self) -> None:
        self.armed = False

    def before_write(self, first_seq: int, count: int) -> None:
        return None

    def before_fsync(self) -> None:
        if self.armed:
            raise OSError(5, "injected fsync failure")


async def test_an_oversized_event_fails_its_own_caller_only(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory, tmp_path / "d", max_record_bytes=4096)
    with pytest.raises(EventTooLargeError) as info:
        await timeline.append(NewEvent("r", "stats", "p", {"blob": "x" * 5000}))
    assert info.value.http_status == 413
    assert await timeline.append(NewEvent("r", "stats", "p", {"ok": True})) == 1


async def test_appends_after_close_are_refused_as_closed(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory, tmp_path / "d")
    await timeline.append(NewEvent("r", "stats", "p"))
    await timeline.aclose()
    await timeline.aclose()  # idempotent
    assert not timeline.ready
    with pytest.raises(TimelineClosedError):
        await timeline.append(NewEvent("r", "stats", "p"))
    with pytest.raises(TimelineClosedError):
        timeline.append_nowait(NewEvent("r", "stats", "p"))


async def test_a_failed_fsync_breaks_the_log_for_good(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    faults = FailingFsync()
    timeline = await asyncio.to_thread(timeline_factory, tmp_path / "d", faults=faults)
    await timeline.append(NewEvent("r", "stats", "p"))
    faults.armed = True
    with pytest.raises(TimelineBrokenError) as info:
        await timeline.append(NewEvent("r", "stats", "p"))
    assert isinstance(info.value.__cause__, OSError)
    faults.armed = False
    with pytest.raises(TimelineBrokenError):
        await timeline.append(NewEvent("r", "stats", "p"))
    assert not timeline.ready


def test_a_second_open_of_the_same_data_dir_fails_fast(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline_factory(tmp_path / "d")
    with pytest.raises(DataDirLockedError, match="in use by another process"):
        Timeline.open(TimelineConfig(tmp_path / "d"))


def test_segments_rotate_and_reads_span_them(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    data_dir = tmp_path / "d"
    timeline = timeline_factory(data_dir, segment_bytes=2048)
    seqs = [
        timeline.append_blocking(NewEvent("r", "stats", "p", {"i": i, "pad": "y" * 60}), 10)
        for i in range(200)
    ]
    segments = sorted((data_dir / "wal").glob("*.wal"))
    assert len(segments) > 5
    assert segments[0].name == f"{1:020d}.wal"
    cold = timeline.read_cold("r", 0, 1000)
    assert [e.seq for e in cold] == seqs
    assert [e.data["i"] for e in cold] == list(range(200))


class WriteGate:
    """Holds every batch before its write until ``open`` is set."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def before_write(self, first_seq: int, count: int) -> None:
        assert self.open.wait(10)

    def before_fsync(self) -> None:
        return None


def test_a_future_cancelled_by_its_worker_thread_does_not_break_the_log(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    gate = WriteGate()
    timeline = timeline_factory(tmp_path / "d", faults=gate)
    fut = timeline.append_nowait(NewEvent("r", "stats", "p", {"n": 1}))
    assert fut.cancel(), "still queued or being written: cancellable"
    gate.open.set()
    assert timeline.append_blocking(NewEvent("r", "stats", "p", {"n": 2}), 10) == 2
    assert timeline.ready and timeline.wal.broken is None
    # Cancelling only dropped the answer: the event itself was written.
    assert [e.data["n"] for e in timeline.read_run_events("r")] == [1, 2]
