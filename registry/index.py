"""Where each run's events live in the WAL: the index behind cold reads.

Ownership: only the WAL writer thread (and recovery, before the writer starts) mutates
the index. Readers on other threads call :meth:`EventIndex.positions_after` without a
lock: each per-run array only ever grows at its end, and ``bisect`` plus slicing of an
``array`` each run under the GIL as one C call, so a reader sees a consistent prefix.
A run removed by :meth:`forget` disappears as a whole (one dict ``pop``).

Memory: 20 bytes per event (``seq`` u64, location u64, length u32) plus about 400 bytes
per run for the arrays and the dict entry: 1,000,000 events in 1,000 runs cost ~20 MB.
A cold read costs O(log n + limit) for a run of n events, independent of the log's size.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

OFFSET_BITS = 40


class Position(NamedTuple):
    """One frame in one segment.

    A NamedTuple, not a frozen dataclass: cold reads build one per event and a frozen
    dataclass costs several times more to construct (docs/PERFORMANCE.md).
    """

    segment_id: int
    offset: int
    length: int


@dataclass(slots=True)
class RunPositions:
    """One run's event positions, in seq order (appended by the writer/recovery only)."""

    run_id: str
    seqs: array[int] = field(default_factory=lambda: array("Q"))
    locs: array[int] = field(default_factory=lambda: array("Q"))
    lens: array[int] = field(default_factory=lambda: array("I"))
    last_ts: int = 0
    """Timestamp of the newest event (recovery derives last activity from it)."""

    def add(self, seq: int, segment_id: int, offset: int, length: int, ts_ms: int) -> None:
        """Append one position."""
        self.seqs.append(seq)
        self.locs.append((segment_id << OFFSET_BITS) | offset)
        self.lens.append(length)
        self.last_ts = ts_ms


class EventIndex:
    """Per-run, seq-ordered positions of every event in the WAL."""

    def __init__(self) -> None:
        self._runs: dict[str, RunPositions] = {}
        self.known_positions: Callable[[str], RunPositions | None] = self._runs.get
        """The run's positions, or None if it has none (the writer's per-event lookup:
        one C call; :meth:`positions_for` creates what is missing)."""

    def positions_for(self, run_id: str) -> RunPositions:
        """The run's positions, created empty if new (writer thread / recovery only)."""
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = RunPositions(run_id)
        return run

    def add(
        self, run_id: str, seq: int, segment_id: int, offset: int, length: int, ts_ms: int = 0
    ) -> None:
        """Record one event (writer thread only; seqs arrive in increasing order)."""
        self.positions_for(run_id).add(seq, segment_id, offset, length, ts_ms)

    def runs(self) -> list[RunPositions]:
        """Every run's positions (a list copy; the objects are live)."""
        return list(self._runs.values())

    def forget(self, run_id: str) -> None:
        """Drop a run's positions (retention eviction)."""
        self._runs.pop(run_id, None)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def count(self, run_id: str) -> int:
        """How many events the run has."""
        run = self._runs.get(run_id)
        return 0 if run is None else len(run.seqs)

    def last_seq(self, run_id: str) -> int:
        """The run's newest seq, 0 when it has none."""
        run = self._runs.get(run_id)
        if run is None or not run.seqs:
            return 0
        return run.seqs[-1]

    def run_ids(self) -> list[str]:
        """Every indexed run (a copy)."""
        return list(self._runs)

    def positions_after(self, run_id: str, after_seq: int, limit: int) -> list[Position]:
        """Positions of the run's first ``limit`` events with ``seq > after_seq``."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        start = bisect_right(run.seqs, after_seq)
        stop = min(start + limit, len(run.seqs))
        return self._slice(run, start, stop)

    def last_positions(self, run_id: str, count: int) -> list[Position]:
        """Positions of the run's newest ``count`` events, oldest first."""
        run = self._runs.get(run_id)
        if run is None:
            return []
        total = len(run.seqs)
        return self._slice(run, max(0, total - count), total)

    @staticmethod
    def _slice(run: RunPositions, start: int, stop: int) -> list[Position]:
        locs = run.locs[start:stop]
        lens = run.lens[start:stop]
        mask = (1 << OFFSET_BITS) - 1
        return [
            Position(loc >> OFFSET_BITS, loc & mask, length)
            for loc, length in zip(locs, lens, strict=True)
        ]

    def runs_after(self, seq: int) -> set[str]:
        """The runs with an event past ``seq`` (O(runs))."""
        return {run.run_id for run in self._runs.values() if run.seqs and run.seqs[-1] > seq}

    def total_events(self) -> int:
        """Events across all runs (O(runs))."""
        return sum(len(run.seqs) for run in self._runs.values())
