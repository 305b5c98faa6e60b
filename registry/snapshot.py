"""Copy-on-write snapshot of per-run event tails: what warm reads and long-polls see.

Rules:

- A :class:`Snapshot` is immutable once published. The WAL writer thread is its only
  builder; it publishes a new one after each durable batch by swapping one reference.
  Readers take the reference and never lock.
- Only the runs appended in the batch get a new :class:`RunTail`; every other run's tail
  is the *same object* as in the previous snapshot (a test pins this).
- At most ``tail_events`` events per run and ``warm_runs`` runs; the least recently
  appended run is evicted first. An evicted run is still readable, from the WAL.
- After a restart the tails are rebuilt from the WAL by the writer thread while it is
  otherwise idle (:meth:`SnapshotBuilder.seed`), newest runs first; until a run is
  seeded its reads are served cold, with identical answers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from registry.events import Event

DEFAULT_TAIL_EVENTS = 256
DEFAULT_WARM_RUNS = 1024


@dataclass(frozen=True, slots=True)
class RunTail:
    """The newest events of one run, oldest first.

    ``complete`` is true when ``events[0]`` is the run's very first event.
    """

    events: tuple[Event, ...]
    complete: bool

    def covers(self, after_seq: int) -> bool:
        """True when every event of the run with ``seq > after_seq`` is in this tail."""
        if self.complete:
            return True
        return bool(self.events) and self.events[0].seq <= after_seq + 1

    def after(self, after_seq: int, limit: int) -> list[Event]:
        """The first ``limit`` events with ``seq > after_seq`` (the tail must cover it)."""
        events = self.events
        lo, hi = 0, len(events)
        while lo < hi:
            mid = (lo + hi) // 2
            if events[mid].seq <= after_seq:
                lo = mid + 1
            else:
                hi = mid
        return list(events[lo : lo + limit])


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Published state: the last durable seq and the warm tails."""

    last_seq: int
    tails: Mapping[str, RunTail]


EMPTY_SNAPSHOT = Snapshot(0, MappingProxyType({}))


class SnapshotBuilder:
    """Writer-thread-owned builder. Not thread-safe: one owner, by design."""

    def __init__(
        self,
        total_events: Callable[[str], int],
        *,
        tail_events: int = DEFAULT_TAIL_EVENTS,
        warm_runs: int = DEFAULT_WARM_RUNS,
    ) -> None:
        if tail_events < 1 or warm_runs < 1:
            raise ValueError("tail_events and warm_runs must be positive")
        self._total_events = total_events
        self._tail_events = tail_events
        self._warm_runs = warm_runs
        self._recency: OrderedDict[str, None] = OrderedDict()
        self._tails: dict[str, RunTail] = {}
        self.current: Snapshot = EMPTY_SNAPSHOT

    def publish(self, batch: list[Event], forgotten: tuple[str, ...] = ()) -> Snapshot:
        """Build and return the snapshot after ``batch`` (ordered by seq) became durable.

        ``forgotten`` runs (evicted from the registry) lose their tails.
        """
        by_run: dict[str, list[Event]] = {}
        for event in batch:
            by_run.setdefault(event.run_id, []).append(event)
        tails = dict(self._tails)
        for run_id in forgotten:
            tails.pop(run_id, None)
            self._recency.pop(run_id, None)
        for run_id, new_events in by_run.items():
            old = tails.get(run_id)
            merged = (old.events if old is not None else ()) + tuple(new_events)
            if len(merged) > self._tail_events:
                merged = merged[-self._tail_events :]
            complete = len(merged) == self._total_events(run_id)
            tails[run_id] = RunTail(merged, complete)
            self._recency[run_id] = None
            self._recency.move_to_end(run_id)
        while len(self._recency) > self._warm_runs:
            coldest, _ = self._recency.popitem(last=False)
            tails.pop(coldest, None)
        self._tails = tails
        last_seq = batch[-1].seq if batch else self.current.last_seq
        self.current = Snapshot(last_seq, MappingProxyType(tails))
        return self.current

    def seed(self, items: list[tuple[str, tuple[Event, ...], bool]]) -> bool:
        """Install tails read back from the WAL after a restart, then publish.

        ``items`` come newest-run first. A seeded run goes to the *cold* end of the
        recency order (runs appended since the restart stay warmer); a run that already
        has a tail (appended since the restart) gets the fuller seeded tail in place.
        Returns False once the warm set is full: seeding should stop.
        """
        tails = dict(self._tails)
        room = True
        for run_id, events, complete in items:
            if run_id not in self._recency:
                if len(self._recency) >= self._warm_runs:
                    room = False
                    break
                self._recency[run_id] = None
                self._recency.move_to_end(run_id, last=False)
            tails[run_id] = RunTail(events[-self._tail_events :], complete)
        self._tails = tails
        self.current = Snapshot(self.current.last_seq, MappingProxyType(tails))
        return room

    def seal(self, last_seq: int) -> Snapshot:
        """Publish the (empty) snapshot that recovery starts from."""
        self.current = Snapshot(last_seq, MappingProxyType(dict(self._tails)))
        return self.current

    @property
    def warm_runs(self) -> int:
        """How many runs have a tail in the current snapshot."""
        return len(self.current.tails)
