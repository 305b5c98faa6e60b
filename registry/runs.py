"""The run registry: a few small fields per run, updated in place as events become durable.

State machines (data, h11 style; terminal states are absorbing):

Stream state, driven by durable events::

    (new) --run_created--> starting --session_connected--> live
    starting|live --stop_requested--> stopping
    starting|live|stopping --session_closed--> ended
    starting|live|stopping --run_interrupted--> interrupted

Delete state, driven by the deletion protocol (:mod:`registry.deletion`)::

    LIVE --claim--> APPEND_IN_FLIGHT --run_deleted durable--> DELETED
                    APPEND_IN_FLIGHT --append failed--> LIVE

An event that is not an allowed transition still happened (it is durable): it updates
``last_activity_ms`` and leaves the state unchanged, with a warning in the log.

Ownership and locking: the WAL writer thread applies durable events; the event loop
claims deletions and reads. Both go through ``_lock``, a leaf lock (nothing else is
acquired while holding it; loop futures are resolved via ``call_soon_threadsafe``).
Readers get :class:`RunView` copies, never the mutable :class:`RunState`.

Expiry is derived at read time: a run in ``live``/``starting`` whose last activity is
older than the TTL reads as ``expired``; :meth:`RunRegistry.touch` (media flowing, a
keepalive) moves ``last_activity_ms`` forward and reverses it. Nothing is persisted.

Retention: deleted runs stay for idempotency in a FIFO of ``deleted_retention``; past
it, the oldest is evicted (state, principal index, WAL index, warm tail) unless it is
*pinned* (its workers can still emit), in which case it stays until unpinned.

One concept in one module, though past 500 lines: every field above, both state machines
and the retention FIFO are kept consistent by the one ``_lock``; split, its invariants
would live in two files.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from registry.events import Event, EventType, now_ms

logger = logging.getLogger(__name__)

DEFAULT_DELETED_RETENTION = 4096


class StreamState(StrEnum):
    """Where a run's media session is."""

    STARTING = "starting"
    LIVE = "live"
    STOPPING = "stopping"
    ENDED = "ended"
    INTERRUPTED = "interrupted"


class DeleteState(StrEnum):
    """Where a run's deletion is."""

    LIVE = "live"
    APPEND_IN_FLIGHT = "append_in_flight"
    DELETED = "deleted"


ACTIVE_STATES = frozenset({StreamState.STARTING, StreamState.LIVE, StreamState.STOPPING})

STREAM_TRANSITIONS: dict[tuple[StreamState | None, str], StreamState] = {
    (None, EventType.RUN_CREATED): StreamState.STARTING,
    (StreamState.STARTING, EventType.SESSION_CONNECTED): StreamState.LIVE,
    (StreamState.STARTING, EventType.STOP_REQUESTED): StreamState.STOPPING,
    (StreamState.LIVE, EventType.STOP_REQUESTED): StreamState.STOPPING,
    (StreamState.STARTING, EventType.SESSION_CLOSED): StreamState.ENDED,
    (StreamState.LIVE, EventType.SESSION_CLOSED): StreamState.ENDED,
    (StreamState.STOPPING, EventType.SESSION_CLOSED): StreamState.ENDED,
    (StreamState.STARTING, EventType.RUN_INTERRUPTED): StreamState.INTERRUPTED,
    (StreamState.LIVE, EventType.RUN_INTERRUPTED): StreamState.INTERRUPTED,
    (StreamState.STOPPING, EventType.RUN_INTERRUPTED): StreamState.INTERRUPTED,
}
"""Allowed stream-state moves. Event types absent from every key move nothing."""

_STATE_EVENTS = frozenset(event_type for _, event_type in STREAM_TRANSITIONS)
_MOVING_EVENTS = frozenset(str(t) for t in _STATE_EVENTS | {EventType.RUN_DELETED})
"""Event types that can change more than ``last_seq``/last activity of a known run."""


class InvalidTransitionError(Exception):
    """An event that is not an allowed move from the run's current stream state."""


def next_stream_state(current: StreamState | None, event_type: str) -> StreamState | None:
    """Apply one event to a stream state; the state is unchanged for non-state events.

    Raises :class:`InvalidTransitionError` (and the caller keeps ``current``) when the
    event moves state but not from ``current``.
    """
    if event_type not in _STATE_EVENTS:
        return current
    nxt = STREAM_TRANSITIONS.get((current, event_type))
    if nxt is None:
        raise InvalidTransitionError(f"{event_type} is not allowed in state {current}")
    return nxt


@dataclass(slots=True)
class RunState:
    """Mutable per-run fields; only the registry touches these, under its lock."""

    run_id: str
    principal: str
    stream: str
    session_id: str
    created_ms: int
    stream_state: StreamState | None
    delete_state: DeleteState
    last_activity_ms: int
    last_seq: int
    deleted_event: Event | None = None
    placeholder: bool = False
    """Created by a delete of a run never seen: removed again if that delete fails."""


@dataclass(frozen=True, slots=True)
class RunView:
    """An immutable copy of one run's metadata, as the API shows it."""

    run_id: str
    principal: str
    stream: str
    session_id: str
    created_ms: int
    last_activity_ms: int
    last_seq: int
    state: str
    stream_state: StreamState | None
    delete_state: DeleteState
    node_id: str = ""
    """The owner node (cluster mode; empty on the embedded WAL, where there is one)."""

    def to_json(self) -> dict[str, object]:
        """The wire shape of ARCHITECTURE.md (``node`` only in cluster mode)."""
        body: dict[str, object] = {
            "id": self.run_id,
            "principal": self.principal,
            "stream": self.stream,
            "state": self.state,
            "created_ms": self.created_ms,
            "last_activity_ms": self.last_activity_ms,
            "session_id": self.session_id or None,
        }
        if self.node_id:
            body["node"] = self.node_id
        return body


class ClaimKind(StrEnum):
    """The four outcomes of claiming a run's deletion."""

    CLAIMED = "claimed"
    ALREADY_DELETED = "already_deleted"
    IN_FLIGHT = "in_flight"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Claim:
    """What :meth:`RunRegistry.claim_delete` decided."""

    kind: ClaimKind
    principal: str = ""
    deleted_event: Event | None = None
    settled: asyncio.Future[None] | None = None
    """For IN_FLIGHT: resolved once the winner committed or rolled back."""


class RunRegistry:
    """Per-run state, a principal index and deleted-run retention."""

    def __init__(
        self,
        *,
        stream_ttl_s: float = 0.0,
        deleted_retention: int = DEFAULT_DELETED_RETENTION,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunState] = {}
        self._by_principal: dict[str, set[str]] = {}
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._pins: dict[str, int] = {}
        self._settle_waiters: dict[
            str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]
        ] = {}
        self._ttl_ms = int(stream_ttl_s * 1000)
        self._retention = deleted_retention
        self._on_evict = on_evict
        self._evicted_pending: list[str] = []

    # ---- applying durable events (writer thread, or recovery before it starts) ----

    def apply(self, event: Event, data: dict[str, object] | None = None) -> None:
        """Apply one durable event. Never raises for a bad transition (it is a fact)."""
        with self._lock:
            self._apply_locked(
                event.run_id,
                event.type,
                event.ts_ms,
                event.principal,
                event.seq,
                data if data is not None else event.data,
                event,
            )

    def apply_many(self, events: Iterable[Event]) -> None:
        """Apply a durable batch under one lock acquisition.

        Most events (``stats``, analyzer events) move no state: for a known run they only
        advance ``last_seq`` and last activity, inline, without the general transition.
        """
        runs = self._runs
        moving = _MOVING_EVENTS
        with self._lock:
            for ev in events:
                seq, run_id, etype, ts_ms, principal, data = ev
                run = runs.get(run_id)
                if run is not None and etype not in moving and not run.placeholder:
                    run.last_seq = seq
                    if ts_ms > run.last_activity_ms:
                        run.last_activity_ms = ts_ms
                    continue
                self._apply_locked(run_id, etype, ts_ms, principal, seq, data, ev)

    def apply_record(
        self,
        run_id: str,
        event_type: str,
        ts_ms: int,
        principal: str,
        seq: int,
        data: dict[str, object] | None,
    ) -> None:
        """Recovery's fast path: the fields of one record, ``data`` only where needed."""
        with self._lock:
            self._apply_locked(run_id, event_type, ts_ms, principal, seq, data, None)

    NEEDS_DATA = frozenset({EventType.RUN_CREATED.value})
    """Event types whose ``data`` recovery must decode for :meth:`apply_record`."""

    STATE_EVENTS = _MOVING_EVENTS
    """Event types that change a run's state; recovery replays only these (and each
    run's first event) through :meth:`apply_record`, then :meth:`finish_recovery`."""

    def finish_recovery(self, activity: Iterable[tuple[str, int, int]]) -> None:
        """Set each run's newest seq and activity time: ``(run_id, last_seq, last_ts)``."""
        with self._lock:
            for run_id, last_seq, last_ts in activity:
                run = self._runs.get(run_id)
                if run is None:
                    continue
                if last_seq > run.last_seq:
                    run.last_seq = last_seq
                if last_ts > run.last_activity_ms:
                    run.last_activity_ms = last_ts

    def _apply_locked(
        self,
        run_id: str,
        event_type: str,
        ts_ms: int,
        principal: str,
        seq: int,
        data: dict[str, object] | None,
        event: Event | None,
    ) -> None:
        run = self._runs.get(run_id)
        if run is None:
            if event_type == EventType.RUN_CREATED:
                payload = data or {}
                run = RunState(
                    run_id=run_id,
                    principal=principal,
                    stream=str(payload.get("stream", "")),
                    session_id=str(payload.get("session_id", "")),
                    created_ms=ts_ms,
                    stream_state=None,
                    delete_state=DeleteState.LIVE,
                    last_activity_ms=ts_ms,
                    last_seq=seq,
                )
            else:
                # An event for a run we never saw created (e.g. the delete of an unknown
                # id): keep a minimal record so the run stays answerable.
                run = RunState(run_id, principal, "", "", ts_ms, None, DeleteState.LIVE, ts_ms, seq)
            self._runs[run_id] = run
            self._by_principal.setdefault(run.principal, set()).add(run_id)
        run.placeholder = False
        run.last_seq = seq
        if ts_ms > run.last_activity_ms:
            run.last_activity_ms = ts_ms
        if event_type == EventType.RUN_DELETED:
            run.delete_state = DeleteState.DELETED
            if event is not None:
                run.deleted_event = event
            elif run.deleted_event is None:
                run.deleted_event = Event(seq, run_id, event_type, ts_ms, principal, {})
            self._deleted[run_id] = None
            self._settle_locked(run_id)
            self._evict_locked()
            return
        try:
            nxt = next_stream_state(run.stream_state, event_type)
        except InvalidTransitionError as exc:
            logger.warning("run %s: %s (seq %d kept, state unchanged)", run_id, exc, seq)
            return
        if nxt != run.stream_state:
            logger.debug("run %s: stream state %s -> %s", run_id, run.stream_state, nxt)
            run.stream_state = nxt

    def fail_deletes(self, run_ids: Iterable[str]) -> None:
        """A batch carrying these runs' ``run_deleted`` failed: roll each back to LIVE."""
        with self._lock:
            for run_id in run_ids:
                run = self._runs.get(run_id)
                if run is None or run.delete_state != DeleteState.APPEND_IN_FLIGHT:
                    continue
                logger.info(
                    "run %s: delete state %s -> %s (append failed)",
                    run_id,
                    run.delete_state,
                    DeleteState.LIVE,
                )
                if run.placeholder:
                    self._remove_locked(run_id)
                else:
                    run.delete_state = DeleteState.LIVE
                self._settle_locked(run_id)

    # ---- the deletion claim (event loop) ----

    def claim_delete(self, run_id: str, principal: str) -> Claim:
        """Compare-and-swap LIVE -> APPEND_IN_FLIGHT; one caller wins.

        An unknown run gets a placeholder in APPEND_IN_FLIGHT so that concurrent deletes
        of the same unknown id still see a single winner (outcome MISSING).
        Must be called from a running event loop (IN_FLIGHT returns a loop future).
        """
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                now = now_ms()
                run = RunState(
                    run_id,
                    principal,
                    "",
                    "",
                    now,
                    None,
                    DeleteState.APPEND_IN_FLIGHT,
                    now,
                    0,
                    placeholder=True,
                )
                self._runs[run_id] = run
                self._by_principal.setdefault(principal, set()).add(run_id)
                return Claim(ClaimKind.MISSING, principal)
            if run.delete_state == DeleteState.DELETED:
                return Claim(ClaimKind.ALREADY_DELETED, run.principal, run.deleted_event)
            if run.delete_state == DeleteState.APPEND_IN_FLIGHT:
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._settle_waiters.setdefault(run_id, []).append((loop, fut))
                return Claim(ClaimKind.IN_FLIGHT, run.principal, settled=fut)
            logger.info(
                "run %s: delete state %s -> %s",
                run_id,
                run.delete_state,
                DeleteState.APPEND_IN_FLIGHT,
            )
            run.delete_state = DeleteState.APPEND_IN_FLIGHT
            return Claim(ClaimKind.CLAIMED, run.principal)

    def delete_waiters(self, run_id: str) -> int:
        """Deleters parked on ``run_id``'s in-flight deletion (claimed IN_FLIGHT, their
        wait not yet settled nor cancelled)."""
        with self._lock:
            return sum(not fut.done() for _, fut in self._settle_waiters.get(run_id, ()))

    def _settle_locked(self, run_id: str) -> None:
        waiters = self._settle_waiters.pop(run_id, [])
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:
                continue

    # ---- retention ----

    def pin(self, run_id: str) -> None:
        """Protect a run from retention eviction (its workers can still emit)."""
        with self._lock:
            self._pins[run_id] = self._pins.get(run_id, 0) + 1

    def unpin(self, run_id: str) -> None:
        """Drop one pin; eviction resumes once no pin is left."""
        with self._lock:
            count = self._pins.get(run_id, 0) - 1
            if count > 0:
                self._pins[run_id] = count
            else:
                self._pins.pop(run_id, None)
            self._evict_locked()
        self.drain_evicted()

    def _evict_locked(self) -> None:
        if len(self._deleted) <= self._retention:
            return
        for run_id in list(self._deleted):
            if len(self._deleted) <= self._retention:
                break
            if run_id in self._pins:
                continue
            del self._deleted[run_id]
            self._remove_locked(run_id)
            self._evicted_pending.append(run_id)

    def _remove_locked(self, run_id: str) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        owned = self._by_principal.get(run.principal)
        if owned is not None:
            owned.discard(run_id)
            if not owned:
                del self._by_principal[run.principal]

    def drain_evicted(self) -> list[str]:
        """Hand evicted run ids to ``on_evict`` (called outside the lock)."""
        with self._lock:
            evicted, self._evicted_pending = self._evicted_pending, []
        if self._on_evict is not None:
            for run_id in evicted:
                self._on_evict(run_id)
        return evicted

    # ---- reads ----

    def touch(self, run_id: str, ts_ms: int | None = None) -> None:
        """Record activity (media flowing, a keepalive) without writing to the WAL."""
        ts = now_ms() if ts_ms is None else ts_ms
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and ts > run.last_activity_ms:
                run.last_activity_ms = ts

    def _view_locked(self, run: RunState, now: int) -> RunView:
        if run.delete_state == DeleteState.DELETED:
            state = "deleted"
        elif run.stream_state is None:
            state = "starting"
        else:
            state = run.stream_state.value
            if (
                self._ttl_ms > 0
                and run.stream_state in (StreamState.STARTING, StreamState.LIVE)
                and now - run.last_activity_ms > self._ttl_ms
            ):
                state = "expired"
        return RunView(
            run.run_id,
            run.principal,
            run.stream,
            run.session_id,
            run.created_ms,
            run.last_activity_ms,
            run.last_seq,
            state,
            run.stream_state,
            run.delete_state,
        )

    def get(self, run_id: str, now: int | None = None) -> RunView | None:
        """One run's metadata (O(1), independent of its history), or None."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.placeholder:
                return None
            return self._view_locked(run, now_ms() if now is None else now)

    def __contains__(self, run_id: object) -> bool:
        with self._lock:
            run = self._runs.get(run_id) if isinstance(run_id, str) else None
            return run is not None and not run.placeholder

    def list_runs(self, principal: str | None = None, now: int | None = None) -> list[RunView]:
        """Every known run (optionally one principal's), newest first."""
        now = now_ms() if now is None else now
        with self._lock:
            if principal is None:
                runs = list(self._runs.values())
            else:
                runs = [self._runs[r] for r in self._by_principal.get(principal, ())]
            views = [self._view_locked(r, now) for r in runs if not r.placeholder]
        views.sort(key=lambda v: (v.created_ms, v.run_id), reverse=True)
        return views

    def _holds_slot_locked(self, run: RunState, now: int) -> bool:
        """The one definition of an *active run* (a run holding a stream slot):
        starting/live/stopping, not deleted, not expired. Admission counts these per
        principal, the ``stream_slots_in_use`` gauge counts all of them."""
        if run.placeholder or run.delete_state == DeleteState.DELETED:
            return False
        if run.stream_state not in ACTIVE_STATES:
            return False
        return self._view_locked(run, now).state != "expired"

    def count_active_runs_for_principal(self, principal: str, now: int | None = None) -> int:
        """Active runs (:meth:`_holds_slot_locked`) of ``principal``. Each run's *current*
        principal is re-checked, so a stale index entry can never count against the wrong
        principal.
        """
        now = now_ms() if now is None else now
        count = 0
        with self._lock:
            for run_id in self._by_principal.get(principal, ()):
                run = self._runs.get(run_id)
                if run is None or run.principal != principal:
                    continue
                if self._holds_slot_locked(run, now):
                    count += 1
        return count

    def count_active_runs(self, now: int | None = None) -> int:
        """Active runs (:meth:`_holds_slot_locked`) of every principal."""
        now = now_ms() if now is None else now
        with self._lock:
            return sum(1 for run in self._runs.values() if self._holds_slot_locked(run, now))

    def unclosed_run_ids(self) -> list[str]:
        """Runs whose session never closed (starting/live/stopping), deleted or not:
        recovery appends ``run_interrupted`` to each, so every run's timeline ends."""
        with self._lock:
            return [r.run_id for r in self._runs.values() if r.stream_state in ACTIVE_STATES]

    def is_pinned(self, run_id: str) -> bool:
        """Whether retention eviction currently skips this run."""
        with self._lock:
            return run_id in self._pins

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for r in self._runs.values() if not r.placeholder)

    @property
    def deleted_retained(self) -> int:
        """How many deleted runs are kept for idempotency."""
        with self._lock:
            return len(self._deleted)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
