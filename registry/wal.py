"""The write-ahead log: one writer thread, group commit, the producers' append calls.

Ownership and threads:

- The writer thread (``wal-writer``) owns the active segment
  (:class:`~registry.segments.SegmentFiles`), the sequence counter and the
  :class:`~registry.index.EventIndex`. Nobody else writes them.
- Producers hand :class:`~registry.events.NewEvent` objects in through the bounded
  :class:`~registry.wal_queue.WalQueue`. The event is encoded (and its size checked) on
  the producer's side, so an oversized event fails its own caller.
- Group commit: the writer takes everything queued, assigns consecutive seqs, writes the
  frames with one ``pwrite`` and makes them durable with one ``fdatasync``. Only then are
  the hooks run (index, registry, snapshot) and the producers confirmed
  (:mod:`registry.confirmations`): a confirmed seq is on disk, and a reader that learns
  of it can read it.
- A failed write is rolled back (the segment is cut back to its last frame, seqs are
  reused) and that batch's producers get :class:`AppendFailedError`; the log stays
  usable. A failed ``fdatasync`` cannot be trusted to be retried (the kernel may have
  dropped the dirty pages), so the log becomes *broken*: that batch and every later
  append get :class:`TimelineBrokenError`. Either way, an append that was refused may or
  may not be found after a restart; one that was confirmed is always found.
- Readers (any thread) go through :class:`~registry.wal_reader.WalReader`, with their
  own read-only descriptors.

Before the writer starts, :meth:`Wal.recover` runs :mod:`registry.recovery` (verify,
truncate a torn tail, quarantine corruption) and continues the log where it ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Literal, NoReturn, Protocol

from registry.confirmations import PendingAppend, confirm_batch, fail_batch
from registry.errors import (
    AppendFailedError,
    RegistryError,
    TimelineBrokenError,
    TimelineClosedError,
)
from registry.events import Event, NewEvent
from registry.histogram import LATENCY_S, Histogram
from registry.index import OFFSET_BITS, EventIndex, Position
from registry.record import DEFAULT_MAX_RECORD_BYTES, FRAME_OVERHEAD, encode_body, encode_frames
from registry.recovery import RecordHook, RecoveryReport, recover_segments
from registry.segments import SegmentFiles
from registry.wal_queue import WalQueue
from registry.wal_reader import WalReader

logger = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


class WalFaults(Protocol):
    """Fault-injection seam (tests, chaos runs). Each hook may raise ``OSError``."""

    def before_write(self, first_seq: int, count: int) -> None:
        """Called on the writer thread before a batch is written."""

    def before_fsync(self) -> None:
        """Called on the writer thread before the batch's ``fdatasync``."""


@dataclass(frozen=True, slots=True)
class WalOptions:
    """Tunables of the log."""

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    queue_capacity: int = 1024
    on_corruption: Literal["quarantine", "fail"] = "quarantine"


@dataclass(frozen=True, slots=True)
class DurableBatch:
    """One group commit, as the hooks see it (built once per batch by the writer)."""

    events: list[Event]
    """The batch's events in seq order."""
    by_run: dict[str, list[Event]]
    """The same events grouped by run (each list in seq order), runs in first-seen order."""


@dataclass(slots=True)
class WalHooks:
    """Callbacks the writer thread runs; they must not raise (errors are logged)."""

    on_durable: Callable[[DurableBatch], None] | None = None
    """After a batch is durable and indexed, before its producers are confirmed."""
    on_failed: Callable[[list[NewEvent]], None] | None = None
    """After a batch failed; its producers are told right after."""
    after_confirm: Callable[[DurableBatch], None] | None = None
    """After the producers of a durable batch were confirmed."""
    on_idle: Callable[[], bool] | None = None
    """Background work run by the writer between batches while the queue is empty, in
    small steps; returns True while more remains (recovery's tail warm-up)."""


@dataclass(slots=True)
class WalStats:
    """Counters the writer thread maintains (read without locking; monotonic ints)."""

    appended: int = 0
    batches: int = 0
    fsyncs: int = 0
    failed_batches: int = 0
    last_batch_size: int = 0


_monotonic = time.monotonic
_new_event = tuple.__new__
"""Builds an :class:`Event` from its six fields without the NamedTuple ``__new__`` call."""
_event_of = itemgetter(0)
_body_of = itemgetter(1)


class Wal:
    """Segmented, checksummed, group-committed append-only log of timeline events."""

    def __init__(
        self,
        wal_dir: Path,
        options: WalOptions | None = None,
        *,
        hooks: WalHooks | None = None,
        faults: WalFaults | None = None,
    ) -> None:
        self.dir = wal_dir
        self.options = options or WalOptions()
        self.hooks = hooks or WalHooks()
        self.faults = faults
        self.index = EventIndex()
        self.stats = WalStats()
        self._max_record_bytes = self.options.max_record_bytes
        self.confirm_latency = Histogram(LATENCY_S)
        """Seconds from an asyncio append's start to its future being resolved on its
        loop (observed once per batch and loop; thread producers are not timed)."""
        self.sync_latency = Histogram(LATENCY_S)
        """Seconds each batch's ``fdatasync`` took: the disk's share of
        ``confirm_latency`` (observed on the writer thread, once per durable batch)."""
        self._queue: WalQueue[PendingAppend] = WalQueue(self.options.queue_capacity)
        self._segments = SegmentFiles(wal_dir, self.options.segment_bytes)
        self._reader = WalReader(self._segments.paths, self.options.max_record_bytes)
        self._next_seq = 1
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._recovered = False

    # ---------------------------------------------------------------- lifecycle

    def recover(
        self,
        on_record: RecordHook | None = None,
        wanted: frozenset[str] = frozenset(),
    ) -> RecoveryReport:
        """Scan, verify and index every segment; truncate a torn tail; then continue the
        last segment (or create the first).

        ``on_record`` and ``wanted``: see :func:`registry.recovery.recover_segments`.
        Blocking (file I/O): call it before the loop needs the log, or in a thread.
        """
        recovered = recover_segments(
            self.dir,
            self.index,
            max_record_bytes=self.options.max_record_bytes,
            on_corruption=self.options.on_corruption,
            on_record=on_record,
            wanted=wanted,
        )
        self._next_seq = recovered.next_seq
        self._segments.paths.extend(recovered.paths)
        if recovered.paths:
            self._segments.open_active(recovered.good_end)
        else:
            self._segments.create(self._next_seq)
        self._recovered = True
        return recovered.report

    def start(self) -> None:
        """Start the writer thread (after :meth:`recover`)."""
        if not self._recovered:
            raise RuntimeError("recover() must run before start()")
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._writer_main, name="wal-writer", daemon=True)
        self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new appends, let the writer drain what is queued, then release files.

        Idempotent. Blocking: joins the writer thread. Errors closing files are
        collected and logged, not raised.
        """
        self._queue.close()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.error("wal: writer did not finish within %ss", timeout)
                return
            self._thread = None
        errors: list[OSError] = []
        if self._broken is None:
            try:
                self._segments.cut_preallocation()
            except OSError as exc:
                errors.append(exc)
        errors += self._reader.close()
        try:
            self._segments.close()
        except OSError as exc:
            errors.append(exc)
        if errors:
            logger.error("wal: %d errors closing files: %s", len(errors), errors)

    @property
    def broken(self) -> BaseException | None:
        """The error that broke the log, or None while it is writable."""
        return self._broken

    @property
    def queue_depth(self) -> int:
        """Events queued and not yet taken by the writer."""
        return len(self._queue)

    @property
    def next_seq(self) -> int:
        """The seq the next durable event will get."""
        return self._next_seq

    # ---------------------------------------------------------------- writer

    def _writer_main(self) -> None:
        idle_work = self.hooks.on_idle is not None
        while True:
            batch = self._queue.take_all(timeout=0 if idle_work else None)
            if not batch:
                if self._queue.closed:
                    return
                if idle_work:
                    idle_work = self._run_idle()
                continue
            try:
                self._commit(batch)
            except BaseException as exc:  # never let the writer die with producers waiting
                logger.exception("wal: writer failed on a batch of %d", len(batch))
                self._broken = exc
                self._fail(batch, TimelineBrokenError("the WAL writer failed"), exc)

    def _commit(self, batch: list[PendingAppend]) -> None:
        if self._broken is not None:
            self._fail(batch, TimelineBrokenError("the WAL is broken"), self._broken)
            return
        first = self._next_seq
        segments = self._segments
        try:
            segments.rotate_if_full(first)
        except OSError as exc:
            logger.error("wal: cannot rotate segment: %s", exc)
            self._fail(batch, AppendFailedError("cannot rotate WAL segment"), exc)
            return
        loc = (segments.active_id << OFFSET_BITS) | segments.size
        try:
            if self.faults is not None:
                self.faults.before_write(first, len(batch))
            bodies = list(map(_body_of, batch))
            data = encode_frames(first, bodies)
            segments.write(data)
        except OSError as exc:
            try:
                segments.rollback()
            except OSError as trunc_exc:
                self._broken = trunc_exc
                self._fail(batch, TimelineBrokenError("WAL write failed, rollback failed"), exc)
                return
            logger.error(
                "wal: write of seqs %d..%d failed and was rolled back: %s",
                first,
                first + len(batch) - 1,
                exc,
            )
            self._fail(batch, AppendFailedError("WAL write failed; nothing was appended"), exc)
            return
        try:
            if self.faults is not None:
                self.faults.before_fsync()
            sync_started = _monotonic()
            segments.sync()
        except OSError as exc:
            self._broken = exc
            logger.critical("wal: fdatasync failed, the log is now read-only: %s", exc)
            self._fail(batch, TimelineBrokenError("WAL fsync failed"), exc)
            return
        self.sync_latency.observe(_monotonic() - sync_started)
        segments.size += len(data)
        self._next_seq = first + len(batch)
        stats = self.stats
        stats.fsyncs += 1
        stats.batches += 1
        stats.appended += len(batch)
        stats.last_batch_size = len(batch)
        durable = self._index(batch, bodies, first, loc)
        self._run_hook(self.hooks.on_durable, durable)
        confirm_batch(batch, first, self.confirm_latency)
        self._run_hook(self.hooks.after_confirm, durable)

    def _index(
        self, batch: list[PendingAppend], bodies: list[bytes], first: int, loc: int
    ) -> DurableBatch:
        """Seqs become events; each goes into the index at ``loc`` (segment | offset).

        The events are built in C-level passes (the batch's fields as columns, then
        ``tuple.__new__`` mapped over them); the loop left in Python is the grouping by
        run and the index's arrays.
        """
        count = len(batch)
        run_ids, types, principals, datas, stamps = zip(*map(_event_of, batch), strict=True)
        events: list[Event] = list(
            map(
                _new_event,
                repeat(Event, count),
                zip(
                    range(first, first + count),
                    run_ids,
                    types,
                    stamps,
                    principals,
                    datas,
                    strict=True,
                ),
            )
        )
        by_run: dict[str, list[Event]] = {}
        known = self.index.known_positions
        positions_for = self.index.positions_for
        seq = first
        for run_id, body, ts_ms, event in zip(run_ids, bodies, stamps, events, strict=True):
            group = by_run.get(run_id)
            if group is None:
                by_run[run_id] = [event]
            else:
                group.append(event)
            run = known(run_id) or positions_for(run_id)
            length = len(body) + FRAME_OVERHEAD
            run.seqs.append(seq)
            run.locs.append(loc)
            run.lens.append(length)
            run.last_ts = ts_ms
            loc += length
            seq += 1
        return DurableBatch(events, by_run)

    def _run_idle(self) -> bool:
        assert self.hooks.on_idle is not None
        try:
            return self.hooks.on_idle()
        except Exception:
            logger.exception("wal: idle work failed; abandoned")
            return False

    def _run_hook(self, hook: Callable[[DurableBatch], None] | None, batch: DurableBatch) -> None:
        if hook is None:
            return
        try:
            hook(batch)
        except Exception:
            logger.exception(
                "wal: hook %r failed for seqs %d..%d",
                hook,
                batch.events[0].seq,
                batch.events[-1].seq,
            )

    def _fail(self, batch: list[PendingAppend], error: RegistryError, cause: BaseException) -> None:
        self.stats.failed_batches += 1
        error.__cause__ = cause
        if self.hooks.on_failed is not None:
            try:
                self.hooks.on_failed([pending[0] for pending in batch])
            except Exception:
                logger.exception("wal: on_failed hook failed")
        fail_batch(batch, error)

    # ---------------------------------------------------------------- producers

    def _refuse(self) -> NoReturn:
        if self._broken is not None:
            raise TimelineBrokenError("the WAL is broken") from self._broken
        raise TimelineClosedError("the timeline is closed")

    def _encode(self, event: NewEvent) -> bytes:
        if self._broken is not None or self._queue.closed:
            self._refuse()
        return encode_body(event, self._max_record_bytes)

    async def submit(self, event: NewEvent) -> asyncio.Future[int]:
        """Queue ``event``; the returned future resolves to its seq once it is durable.

        Cancellation: if cancelled while waiting for queue space, nothing was queued.
        Once this returns, the append happens whatever the caller does next.
        """
        started = _monotonic()
        body = self._encode(event)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        item: PendingAppend = (event, body, loop, fut, started)
        if not self._queue.offer(item):
            await self._queue.put(item)
        return fut

    async def append(self, event: NewEvent) -> int:
        """Append durably and return the seq.

        One coroutine, no intermediate awaits: encode, queue without waiting when there
        is room (:meth:`WalQueue.offer`), then wait for the writer's confirmation.

        Cancellation: before the event is queued, nothing is written; after, the event is
        still written (the writer does not look back) but the caller no longer learns
        its seq.
        """
        started = _monotonic()
        if self._broken is not None:  # a closed queue refuses in offer/put
            self._refuse()
        body = encode_body(event, self._max_record_bytes)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        item: PendingAppend = (event, body, loop, fut, started)
        if not self._queue.offer(item):
            await self._queue.put(item)
        return await fut

    def submit_blocking(
        self, event: NewEvent, timeout: float | None = None
    ) -> concurrent.futures.Future[int]:
        """Queue from a worker thread, waiting up to ``timeout`` s for queue space."""
        body = self._encode(event)
        cfut: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._queue.put_blocking((event, body, None, cfut, 0.0), timeout)
        return cfut

    def submit_nowait(self, event: NewEvent) -> concurrent.futures.Future[int]:
        """Queue without ever blocking; raises :class:`QueueFullError` when full."""
        body = self._encode(event)
        cfut: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._queue.put_nowait((event, body, None, cfut, 0.0))
        return cfut

    # ---------------------------------------------------------------- readers

    def read_positions(self, positions: list[Position]) -> list[Event]:
        """Decode the events at ``positions`` (blocking file I/O; any thread).

        Adjacent frames of one segment are read with one ``pread``.
        """
        return self._reader.read_positions(positions)

    def read_all(self) -> list[Event]:
        """Every durable event in seq order (blocking; tests and tools, not hot paths)."""
        return self._reader.read_all()


__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "DurableBatch",
    "Wal",
    "WalFaults",
    "WalHooks",
    "WalOptions",
    "WalStats",
]
