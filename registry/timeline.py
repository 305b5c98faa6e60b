"""The durable run timeline: the one object the rest of the server talks to.

Wiring (all on the WAL writer thread, in this order, after each durable batch):
``EventIndex.add`` -> :meth:`RunRegistry.apply_many` -> retention evictions ->
:meth:`SnapshotBuilder.publish` (one reference swap) -> producers confirmed ->
:meth:`WaitHub.notify` -> :meth:`BatchFeed.publish` (whole-log followers,
:mod:`registry.feed`). Hence a confirmed seq is already readable, and a long-poller
woken for it finds it.

Reads: :meth:`Timeline.read_run_events` answers from the published snapshot when the
run's warm tail covers the cursor, else from the WAL through the index; the two give
identical results (property-tested). The warm path takes no lock.

Lifecycle: :meth:`Timeline.open` (blocking: lock file, recovery, writer start, then
``run_interrupted`` for each run that was live; the warm tails are then rebuilt by the
writer thread while it is idle, newest runs first, and :attr:`Timeline.warmed` is set)
and :meth:`Timeline.close` (drains and joins the writer, releases the lock; closing twice
is harmless). A second process opening the same data dir fails with
:class:`DataDirLockedError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from registry.deletion import DeleteResult, RunDeleter
from registry.errors import (
    InvalidCursorError,
    NonBlockingDeleteError,
    UnknownRunError,
)
from registry.events import Event, EventType, NewEvent
from registry.feed import BatchFeed
from registry.histogram import BATCH_SIZES, Histogram
from registry.lockfile import DataDirLock
from registry.record import DEFAULT_MAX_RECORD_BYTES, decode_frame_at, principal_at
from registry.recovery import RecoveryReport
from registry.runs import DEFAULT_DELETED_RETENTION, RunRegistry, RunView
from registry.snapshot import (
    DEFAULT_TAIL_EVENTS,
    DEFAULT_WARM_RUNS,
    Snapshot,
    SnapshotBuilder,
)
from registry.waiters import MAX_WAIT_S as MAX_WAIT_S  # re-exported: the routes' bound
from registry.waiters import WaitHub, check_wait, long_poll
from registry.wal import (
    DEFAULT_SEGMENT_BYTES,
    DurableBatch,
    Wal,
    WalFaults,
    WalHooks,
    WalOptions,
)

logger = logging.getLogger(__name__)

MAX_READ_LIMIT = 1000
MAX_CURSOR = (1 << 63) - 1

_event_type = itemgetter(2)
"""``event.type`` (an :class:`Event` is a tuple; type is its third field)."""


@dataclass(frozen=True, slots=True)
class TimelineConfig:
    """Everything the timeline needs to know; defaults are ARCHITECTURE.md's."""

    data_dir: Path
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    queue_capacity: int = 1024
    tail_events: int = DEFAULT_TAIL_EVENTS
    warm_runs: int = DEFAULT_WARM_RUNS
    deleted_retention: int = DEFAULT_DELETED_RETENTION
    stream_ttl_s: float = 0.0
    on_corruption: Literal["quarantine", "fail"] = "quarantine"


def check_cursor(after_seq: object, limit: object) -> tuple[int, int]:
    """Validate a read cursor: ``0 <= after_seq < 2**63``, ``1 <= limit <= 1000``."""
    if isinstance(after_seq, bool) or not isinstance(after_seq, int):
        raise InvalidCursorError("after must be an integer")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidCursorError("limit must be an integer")
    if not 0 <= after_seq <= MAX_CURSOR:
        raise InvalidCursorError(f"after must be between 0 and {MAX_CURSOR}")
    if not 1 <= limit <= MAX_READ_LIMIT:
        raise InvalidCursorError(f"limit must be between 1 and {MAX_READ_LIMIT}")
    return after_seq, limit


class Timeline:
    """WAL + run registry + warm snapshot + long-poll hub + single-winner deletion."""

    def __init__(self, config: TimelineConfig, *, faults: WalFaults | None = None) -> None:
        self.config = config
        self._lock_file = DataDirLock(config.data_dir)
        self.wal = Wal(
            config.data_dir / "wal",
            WalOptions(
                segment_bytes=config.segment_bytes,
                max_record_bytes=config.max_record_bytes,
                queue_capacity=config.queue_capacity,
                on_corruption=config.on_corruption,
            ),
            hooks=WalHooks(
                on_durable=self._on_durable,
                on_failed=self._on_failed,
                after_confirm=self._after_confirm,
                on_idle=self._warm_step,
            ),
            faults=faults,
        )
        self.runs = RunRegistry(
            stream_ttl_s=config.stream_ttl_s,
            deleted_retention=config.deleted_retention,
            on_evict=self._queue_forget,
        )
        self._snapshots = SnapshotBuilder(
            self.wal.index.count, tail_events=config.tail_events, warm_runs=config.warm_runs
        )
        self._forget_lock = threading.Lock()
        self._to_forget: list[str] = []
        self.waiters = WaitHub()
        self.feed = BatchFeed()
        """Whole-log followers (webhooks): each batch's runs and newest seq."""
        self._deleter = RunDeleter(self.runs, self.wal)
        self.recovery: RecoveryReport | None = None
        self.interrupted: list[str] = []
        self._closed = False
        self._to_warm: list[str] = []
        self.confirm_latency: Histogram = self.wal.confirm_latency
        """Seconds from ``append`` to its durable confirmation (async appends): until the
        appender's future is resolved on its loop (recorded per batch, not per append)."""
        self.sync_latency: Histogram = self.wal.sync_latency
        """Seconds each group commit's ``fdatasync`` took (the disk's share of
        ``confirm_latency``)."""
        self.batch_sizes = Histogram(BATCH_SIZES)
        """Events per group commit (one fsync each)."""
        self.event_counts: Counter[str] = Counter()
        """Durable events by type since start (writer thread writes, anyone reads)."""
        self.warmed = threading.Event()
        """Set once the warm tails are rebuilt after recovery (reads are correct before)."""

    # ---------------------------------------------------------------- lifecycle

    @classmethod
    def open(cls, config: TimelineConfig, *, faults: WalFaults | None = None) -> Timeline:
        """Lock the data dir, recover, start the writer, interrupt runs left live.

        Blocking (file I/O, fsync): from async code use ``await asyncio.to_thread(...)``.
        Raises :class:`DataDirLockedError` if another process holds the data dir, and
        :class:`CorruptLogError` on mid-log corruption when ``on_corruption="fail"``.
        """
        timeline = cls(config, faults=faults)
        timeline._lock_file.acquire()
        try:
            timeline._recover()
        except BaseException:
            timeline.wal.close()
            timeline._lock_file.release()
            raise
        return timeline

    def _recover(self) -> None:
        registry = self.runs
        needs_data = RunRegistry.NEEDS_DATA

        def on_record(
            run_id: str, etype: str, seq: int, ts_ms: int, buf: bytes, offset: int
        ) -> None:
            data = decode_frame_at(buf, offset).data if etype in needs_data else None
            registry.apply_record(run_id, etype, ts_ms, principal_at(buf, offset), seq, data)

        self.recovery = self.wal.recover(on_record, RunRegistry.STATE_EVENTS)
        index = self.wal.index
        registry.finish_recovery(
            (run.run_id, run.seqs[-1], run.last_ts) for run in index.runs() if run.seqs
        )
        for run_id in registry.drain_evicted():
            index.forget(run_id)
        newest_first = sorted(index.runs(), key=lambda r: r.seqs[-1] if r.seqs else 0, reverse=True)
        self._to_warm = [r.run_id for r in newest_first[: self.config.warm_runs]]
        if not self._to_warm:
            self.warmed.set()
        self._snapshots.seal(self.wal.next_seq - 1)
        self.wal.start()
        live = registry.unclosed_run_ids()
        if live:
            futures = []
            for run_id in live:
                view = registry.get(run_id)
                principal = view.principal if view is not None else ""
                futures.append(
                    self.wal.submit_blocking(
                        NewEvent(
                            run_id,
                            EventType.RUN_INTERRUPTED,
                            principal,
                            {"reason": "server_restart"},
                        )
                    )
                )
            for fut in futures:
                fut.result()
            logger.warning(
                "recovery: %d runs were live when the previous process stopped; "
                "appended run_interrupted for each",
                len(live),
            )
        self.interrupted = live

    WARM_STEP_RUNS = 16

    def _warm_step(self) -> bool:
        """Writer thread, while idle: rebuild a few warm tails from the WAL."""
        if not self._to_warm:
            self.warmed.set()
            return False
        step, self._to_warm = (
            self._to_warm[: self.WARM_STEP_RUNS],
            self._to_warm[self.WARM_STEP_RUNS :],
        )
        index = self.wal.index
        items = []
        for run_id in step:
            total = index.count(run_id)
            if total == 0:
                continue
            positions = index.last_positions(run_id, self.config.tail_events)
            events = tuple(self.wal.read_positions(positions))
            items.append((run_id, events, len(events) == total))
        if not self._snapshots.seed(items) or not self._to_warm:
            self._to_warm = []
            self.warmed.set()
            return False
        return True

    def close(self) -> None:
        """Flush and stop the writer, release files and the lock (idempotent, blocking)."""
        if self._closed:
            return
        self._closed = True
        self.wal.close()
        self._lock_file.release()

    async def aclose(self) -> None:
        """:meth:`close` off the event loop."""
        await asyncio.to_thread(self.close)

    # ---------------------------------------------------------------- writer hooks

    def _queue_forget(self, run_id: str) -> None:
        with self._forget_lock:
            self._to_forget.append(run_id)

    def _on_durable(self, batch: DurableBatch) -> None:
        events = batch.events
        self.batch_sizes.observe(len(events))
        self.event_counts.update(map(_event_type, events))
        self.runs.apply_many(events)
        self.runs.drain_evicted()
        forgotten: tuple[str, ...] = ()
        if self._to_forget:
            with self._forget_lock:
                forgotten, self._to_forget = tuple(self._to_forget), []
            for run_id in forgotten:
                self.wal.index.forget(run_id)
        self._snapshots.publish(batch.by_run, events[-1].seq, forgotten)

    def _on_failed(self, events: list[NewEvent]) -> None:
        deleted = [ev.run_id for ev in events if ev.type == EventType.RUN_DELETED]
        if deleted:
            self.runs.fail_deletes(deleted)

    def _after_confirm(self, batch: DurableBatch) -> None:
        self.waiters.notify(batch.by_run)
        self.feed.publish(batch.by_run, batch.events[-1].seq)

    # ---------------------------------------------------------------- appends

    def append(self, event: NewEvent) -> Coroutine[Any, Any, int]:
        """Append durably: ``seq = await timeline.append(event)`` returns once the event
        is on disk.

        Returns the WAL's append coroutine itself rather than wrapping it in one more
        (one coroutine frame less to create and resume per append).
        Cancellation: before the event is queued nothing is written; after, it is
        written anyway and only the answer is lost.
        """
        return self.wal.append(event)

    def append_blocking(self, event: NewEvent, timeout: float | None = None) -> int:
        """Worker-thread flavor: waits for queue space and durability (never on a loop)."""
        return self.wal.submit_blocking(event, timeout).result(timeout)

    def append_nowait(self, event: NewEvent) -> concurrent.futures.Future[int]:
        """Never blocks; raises :class:`QueueFullError` when the queue is full.

        ``run_deleted`` is refused (:class:`NonBlockingDeleteError`): deletion is
        always confirmed, through :meth:`delete_run`.
        """
        if event.type == EventType.RUN_DELETED:
            raise NonBlockingDeleteError("run_deleted must go through delete_run")
        return self.wal.submit_nowait(event)

    async def delete_run(
        self, run_id: str, principal: str, data: dict[str, object] | None = None
    ) -> DeleteResult:
        """Single-winner deletion (see :mod:`registry.deletion`)."""
        return await self._deleter.delete(run_id, principal, data)

    # ---------------------------------------------------------------- reads

    async def get_run(self, run_id: str) -> RunView | None:
        """:meth:`RunRegistry.get` behind the face both backends share (cluster mode's
        reads go to its store)."""
        return self.runs.get(run_id)

    async def list_runs(self, principal: str | None = None) -> list[RunView]:
        """:meth:`RunRegistry.list_runs` behind the face both backends share."""
        return self.runs.list_runs(principal)

    @property
    def snapshot(self) -> Snapshot:
        """The latest published snapshot (one reference read, no lock)."""
        return self._snapshots.current

    @property
    def durable_seq(self) -> int:
        """The newest durable seq readers can see (the snapshot's; 0 for an empty log)."""
        return self._snapshots.current.last_seq

    def runs_after(self, seq: int) -> set[str]:
        """The runs with a durable event past ``seq`` (O(runs), from any thread)."""
        return self.wal.index.runs_after(seq)

    def _known(self, run_id: str) -> None:
        if run_id not in self.runs and run_id not in self.wal.index:
            raise UnknownRunError(f"unknown run {run_id!r}")

    def read_warm(self, run_id: str, after_seq: int, limit: int) -> list[Event] | None:
        """The answer from the snapshot, or None when the warm tail does not cover it."""
        after_seq, limit = check_cursor(after_seq, limit)
        tail = self._snapshots.current.tails.get(run_id)
        if tail is not None and tail.covers(after_seq):
            return tail.after(after_seq, limit)
        return None

    def read_cold(self, run_id: str, after_seq: int, limit: int) -> list[Event]:
        """The answer from the WAL through the index (blocking file I/O)."""
        after_seq, limit = check_cursor(after_seq, limit)
        return self.wal.read_positions(self.wal.index.positions_after(run_id, after_seq, limit))

    def read_run_events(self, run_id: str, after_seq: int = 0, limit: int = 100) -> list[Event]:
        """Events of ``run_id`` with ``seq > after_seq``, oldest first, at most ``limit``.

        Warm when the snapshot covers the cursor, else cold (blocking I/O: from the loop
        use :meth:`read_events`). Raises :class:`UnknownRunError`,
        :class:`InvalidCursorError`.
        """
        self._known(run_id)
        warm = self.read_warm(run_id, after_seq, limit)
        if warm is not None:
            return warm
        return self.read_cold(run_id, after_seq, limit)

    async def read_events(self, run_id: str, after_seq: int = 0, limit: int = 100) -> list[Event]:
        """:meth:`read_run_events` for the loop: the cold path runs in a thread."""
        self._known(run_id)
        warm = self.read_warm(run_id, after_seq, limit)
        if warm is not None:
            return warm
        return await asyncio.to_thread(self.read_cold, run_id, after_seq, limit)

    async def wait_for_events(
        self, run_id: str, after_seq: int, limit: int = 100, wait_s: float = 30.0
    ) -> list[Event]:
        """Long-poll: events after ``after_seq``, waiting up to ``wait_s`` s for one.

        Returns at once if there already are some (no lost wakeup, see
        :mod:`registry.waiters`); an empty list on timeout.
        Cancellation: the waiter is unregistered; nothing else changes.
        """
        check_wait(wait_s)
        events = await self.read_events(run_id, after_seq, limit)
        if events or wait_s == 0:
            return events
        return await long_poll(
            self.waiters, run_id, lambda: self.read_events(run_id, after_seq, limit), wait_s
        )

    @property
    def ready(self) -> bool:
        """Recovered, writer running, log not broken, not closed."""
        return self.recovery is not None and self.wal.broken is None and not self._closed
