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

Cost: a tail is held as immutable full chunks of :data:`CHUNK_EVENTS` events plus one
*open* chunk, a list that is only ever appended to and is shared by consecutive tails of
the run; each tail sees only the first ``n_open`` entries of it, so what a published
tail shows never changes. Appending ``k`` events to a run is ``k`` list appends and one
small tuple; every ``CHUNK_EVENTS`` appends the open chunk is frozen into a tuple. No
tail is ever copied whole. Why: with one event per run and batch (the worst case, every
append touching a full 256-event tail) rebuilding whole tuples made the writer thread
copy, and the garbage collector traverse, a new 256-reference tuple per append
(figures in docs/PERFORMANCE.md). The ``tails`` dict is still copied once per batch
(one C-level copy).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from operator import itemgetter
from types import MappingProxyType
from typing import NamedTuple

from registry.events import Event

DEFAULT_TAIL_EVENTS = 256
DEFAULT_WARM_RUNS = 1024
CHUNK_EVENTS = 32
"""Events per tail chunk: the most an append copies of one run's tail."""

_seq_of = itemgetter(0)
"""``event.seq`` (an :class:`Event` is a tuple; seq is its first field)."""


class RunTail(NamedTuple):
    """The newest events of one run, oldest first.

    The events are ``chunks`` (full, immutable) followed by ``open[:n_open]``, minus
    the first ``skip`` (older than the tail, kept until their whole chunk falls out):
    ``size`` events. ``open`` is append-only and shared with the run's later tails;
    nothing this tail shows ever changes. ``complete`` is true when the tail's first
    event is the run's very first event.

    A ``NamedTuple`` rather than a frozen dataclass: one is built per appended run and
    batch on the writer thread, through ``tuple.__new__``, at a fraction of a frozen
    slots dataclass's cost (docs/PERFORMANCE.md). Immutable either way.
    """

    chunks: tuple[tuple[Event, ...], ...]
    open: list[Event]
    n_open: int
    skip: int
    size: int
    complete: bool

    @classmethod
    def of(cls, events: tuple[Event, ...] | list[Event], complete: bool) -> RunTail:
        """A tail holding exactly ``events`` (oldest first)."""
        full = len(events) // CHUNK_EVENTS * CHUNK_EVENTS
        chunks = tuple(tuple(events[i : i + CHUNK_EVENTS]) for i in range(0, full, CHUNK_EVENTS))
        tail = list(events[full:])
        return cls(chunks, tail, len(tail), 0, len(events), complete)

    def _parts(self) -> list[Sequence[Event]]:
        """The visible events as consecutive non-empty sequences."""
        parts: list[Sequence[Event]] = list(self.chunks)
        if self.n_open:
            parts.append(self.open[: self.n_open])
        if self.skip:
            parts[0] = parts[0][self.skip :]
        return parts

    @property
    def events(self) -> tuple[Event, ...]:
        """The tail's events, oldest first (a flat copy: for tests and tools)."""
        return tuple(chain.from_iterable(self._parts()))

    def covers(self, after_seq: int) -> bool:
        """True when every event of the run with ``seq > after_seq`` is in this tail."""
        if self.complete:
            return True
        if not self.size:
            return False
        first = self.chunks[0][self.skip] if self.chunks else self.open[self.skip]
        return first.seq <= after_seq + 1

    def after(self, after_seq: int, limit: int) -> list[Event]:
        """The first ``limit`` events with ``seq > after_seq`` (the tail must cover it)."""
        out: list[Event] = []
        if not self.size or limit <= 0:
            return out
        chunks, skip, n_open = self.chunks, self.skip, self.n_open
        lo, hi = 0, len(chunks)
        while lo < hi:  # the first full chunk whose newest event is past the cursor
            mid = (lo + hi) // 2
            if chunks[mid][-1].seq <= after_seq:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(chunks):
            start = bisect_right(chunks[lo], after_seq, key=_seq_of)
            if lo == 0 and start < skip:
                start = skip
            for chunk in chunks[lo:]:
                out.extend(chunk[start : start + limit - len(out)])
                if len(out) >= limit:
                    return out
                start = 0
            stop = min(n_open, limit - len(out))
            out.extend(self.open[:stop])
            return out
        start = bisect_right(self.open, after_seq, 0, n_open, key=_seq_of)
        if not chunks and start < skip:
            start = skip
        out.extend(self.open[start : min(n_open, start + limit)])
        return out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Published state: the last durable seq and the warm tails."""

    last_seq: int
    tails: Mapping[str, RunTail]


EMPTY_SNAPSHOT = Snapshot(0, MappingProxyType({}))

_new_tail = tuple.__new__


def extend_tail(
    old: RunTail | None, new: list[Event], tail_events: int, complete_if_new: bool
) -> RunTail:
    """``old`` (or nothing) followed by ``new``, cut to the newest ``tail_events``.

    Appends to the open chunk ``old`` shares with its successor (``old`` still sees only
    its own prefix of it); freezes it into a tuple when full. ``complete_if_new`` says
    whether ``new`` starts the run (used only when there is no ``old``).
    """
    if old is None:
        chunks: tuple[tuple[Event, ...], ...] = ()
        tail: list[Event] = []
        n_open = skip = size = 0
        complete = complete_if_new
    else:
        chunks, tail, n_open, skip, size, complete = old
        if len(tail) != n_open:
            # Appended past this tail already (a publish that failed half-way): fork it,
            # so the events this tail does not show never become visible.
            tail = tail[:n_open]
        elif len(new) == 1 and n_open < CHUNK_EVENTS:
            # The common case (one event of a run per batch) without the loops below:
            # room in the open chunk, at most one event out of a full tail.
            tail.append(new[0])
            if size < tail_events:
                size += 1
            else:
                complete = False
                skip += 1
                if chunks and skip == len(chunks[0]):
                    skip = 0
                    chunks = chunks[1:]
            return _new_tail(RunTail, (chunks, tail, n_open + 1, skip, size, complete))
    for event in new:
        if n_open == CHUNK_EVENTS:
            chunks = (*chunks, tuple(tail))
            tail = []
            n_open = 0
        tail.append(event)
        n_open += 1
    size += len(new)
    if size > tail_events:
        complete = False
        skip += size - tail_events
        size = tail_events
        while chunks and skip >= len(chunks[0]):
            skip -= len(chunks[0])
            chunks = chunks[1:]
    return _new_tail(RunTail, (chunks, tail, n_open, skip, size, complete))


class SnapshotBuilder:
    """Writer-thread-owned builder. Not thread-safe: one owner, by design.

    Recency (least recently appended first) is the insertion order of the tails dict
    itself: a run appended to moves to its end, eviction takes from its front.
    """

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
        self._tails: dict[str, RunTail] = {}
        self.current: Snapshot = EMPTY_SNAPSHOT

    def publish(
        self,
        by_run: Mapping[str, list[Event]],
        last_seq: int,
        forgotten: tuple[str, ...] = (),
    ) -> Snapshot:
        """Build and return the snapshot after a durable batch.

        ``by_run`` maps each appended run to its new events (in seq order); ``last_seq``
        is the batch's newest seq. ``forgotten`` runs (evicted from the registry) lose
        their tails.
        """
        tails = dict(self._tails)
        for run_id in forgotten:
            tails.pop(run_id, None)
        tail_events = self._tail_events
        total_events = self._total_events
        for run_id, new_events in by_run.items():
            old = tails.pop(run_id, None)
            tails[run_id] = extend_tail(
                old,
                new_events,
                tail_events,
                old is None and len(new_events) == total_events(run_id),
            )
        excess = len(tails) - self._warm_runs
        if excess > 0:
            for coldest in list(islice(tails, excess)):
                del tails[coldest]
        self._tails = tails
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
        colder: dict[str, RunTail] = {}
        room = True
        for run_id, events, complete in items:
            tail = RunTail.of(events[-self._tail_events :], complete)
            if run_id in tails:
                tails[run_id] = tail
                continue
            if len(tails) + len(colder) >= self._warm_runs:
                room = False
                break
            colder[run_id] = tail
        # Newest-run first in ``items``: the last seeded is the coldest of all.
        merged = dict(reversed(colder.items()))
        merged.update(tails)
        self._tails = merged
        self.current = Snapshot(self.current.last_seq, MappingProxyType(merged))
        return room

    def seal(self, last_seq: int) -> Snapshot:
        """Publish the (empty) snapshot that recovery starts from."""
        self.current = Snapshot(last_seq, MappingProxyType(dict(self._tails)))
        return self.current

    @property
    def warm_runs(self) -> int:
        """How many runs have a tail in the current snapshot."""
        return len(self.current.tails)
