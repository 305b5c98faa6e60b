"""The write-ahead log: segment files, one writer thread, group commit, cold reads.

Ownership and threads:

- The writer thread (``wal-writer``) owns the active segment's file descriptor, the
  sequence counter and the :class:`~registry.index.EventIndex`. Nobody else writes them.
- Producers hand :class:`~registry.events.NewEvent` objects in through a bounded
  :class:`~registry.wal_queue.WalQueue`. The event is encoded (and its size
  checked) on the producer's side, so an oversized event fails its own caller.
- Group commit: the writer takes everything queued, assigns consecutive seqs, writes the
  frames with one ``pwrite`` and makes them durable with one ``fdatasync``. Only then are
  the hooks run (index, registry, snapshot) and the producers' futures confirmed: a
  confirmed seq is on disk, and a reader that learns of it can read it.
- A failed write is rolled back (the segment is truncated to its size before the batch,
  seqs are reused) and that batch's producers get :class:`AppendFailedError`; the log
  stays usable. A failed ``fdatasync`` cannot be trusted to be retried (the kernel may
  have dropped the dirty pages), so the log becomes *broken*: that batch and every later
  append get :class:`TimelineBrokenError`. Either way, an append that was refused may or
  may not be found after a restart; one that was confirmed is always found.
- Readers (any thread) use their own read-only descriptors and ``os.pread``.
- The active segment is preallocated ahead of the writes (``posix_fallocate``, in steps
  of :data:`PREALLOCATE_BYTES`, never past ``segment_bytes`` unless one batch needs it):
  an ``fdatasync`` that does not have to grow the file is measurably cheaper (ext4, this
  project's bench disk: p50 ~110-130 us growing vs ~75-85 us within allocated space) and
  does not queue behind other files' journal commits. A segment is cut back to its last
  frame when the writer moves to the next one and on a clean close, so only the active
  segment of a log that crashed ends in zeros, which recovery truncates like any torn
  tail (see :mod:`registry.record`).

Recovery (:meth:`Wal.recover`, before the writer starts) scans every segment in order
and applies the rules of :mod:`registry.record`: a torn tail of the last segment is
truncated; corruption elsewhere is either fatal (``on_corruption="fail"``) or the bad
remainder and every later segment are moved, intact, to ``wal/quarantine/`` and the log
continues from the last good record (``"quarantine"``, the default; each recovery gets
its own ``quarantine/<UTC time>-<n>/`` folder, so nothing quarantined is ever
overwritten). Both are logged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn, Protocol, cast

from registry.errors import (
    AppendFailedError,
    CorruptLogError,
    RegistryError,
    TimelineBrokenError,
    TimelineClosedError,
)
from registry.events import Event, NewEvent
from registry.histogram import LATENCY_S, Histogram
from registry.index import OFFSET_BITS, EventIndex, Position, RunPositions
from registry.record import (
    DEFAULT_MAX_RECORD_BYTES,
    FRAME_OVERHEAD,
    ScanEnd,
    ScanOutcome,
    decode_frame_at,
    decode_payload,
    encode_body_positional,
    encode_frames,
    scan_frames,
    scan_segment,
)
from registry.wal_queue import WalQueue

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".wal"

RecordHook = Callable[[str, str, int, int, bytes, int], None]
"""Recovery callback: ``(run_id, type, seq, ts_ms, segment_bytes, offset)``."""
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
PREALLOCATE_BYTES = 4 * 1024 * 1024
"""How far ahead of the writes the active segment is allocated at a time."""


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


@dataclass(slots=True)
class RecoveryReport:
    """What :meth:`Wal.recover` found."""

    segments: int = 0
    records: int = 0
    last_seq: int = 0
    torn_tail_bytes: int = 0
    corruption: CorruptLogError | None = None
    quarantined: list[str] = field(default_factory=list)
    seconds: float = 0.0


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


_Pending = tuple[
    NewEvent,
    bytes,
    asyncio.AbstractEventLoop | None,
    "asyncio.Future[int] | concurrent.futures.Future[int]",
    float,
]
"""What a producer queues: ``(event, encoded body, loop or None, future, monotonic start)``.

A plain tuple: one is built per append (0.05 us, a slots class 0.5 us). ``loop`` is None
for thread producers, whose future is a :class:`concurrent.futures.Future`."""

_monotonic = time.monotonic
_new_event = tuple.__new__
"""Builds an :class:`Event` from its six fields without the NamedTuple ``__new__`` call."""


def settle_futures(results: list[tuple[asyncio.Future[int], int | BaseException]]) -> None:
    """Resolve loop futures with seqs or errors (runs on their loop; skips done ones)."""
    for fut, result in results:
        if fut.done():
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_name(first_seq: int) -> str:
    """File name of the segment whose first record has ``first_seq``."""
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


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
        self._queue: WalQueue[_Pending] = WalQueue(self.options.queue_capacity)
        self._segments: list[Path] = []
        self._readers: dict[int, int] = {}
        self._readers_lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._allocated = 0
        """The active segment's file size: ``_size`` plus preallocated, unwritten space."""
        self._preallocate = True
        self._next_seq = 1
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._recovered = False

    # ---------------------------------------------------------------- recovery

    def recover(
        self,
        on_record: RecordHook | None = None,
        wanted: frozenset[str] = frozenset(),
    ) -> RecoveryReport:
        """Scan, verify and index every segment; truncate a torn tail.

        ``on_record(run_id, type, seq, ts_ms, segment_bytes, offset)`` is called, in seq
        order, for each record whose type is in ``wanted`` and for the first record of
        every run (decode more of it with :func:`registry.record.decode_frame_at`). Every
        other record is only indexed: that keeps recovery at a few microseconds per
        record. Blocking (file I/O): call it before the loop needs the log, or in a thread.
        """
        started = time.monotonic()
        report = RecoveryReport()
        self.dir.mkdir(parents=True, exist_ok=True)
        paths = sorted(p for p in self.dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        expect = 1
        good_end = 0
        max_record = self.options.max_record_bytes
        wanted_raw = frozenset(t.encode() for t in wanted)
        runs: dict[bytes, RunPositions] = {}
        types: dict[bytes, str] = {}
        positions_for = self.index.positions_for
        for number, path in enumerate(paths):
            is_last = number == len(paths) - 1
            buf = path.read_bytes()
            outcome = ScanOutcome()
            seg_id = len(self._segments)
            self._segments.append(path)
            base = seg_id << OFFSET_BITS
            for offset, length, seq, ts_ms, raw_run, raw_type in scan_frames(
                buf, expect, outcome, is_last=is_last, max_record_bytes=max_record
            ):
                run = runs.get(raw_run)
                first = run is None
                if run is None:
                    run = runs[raw_run] = positions_for(raw_run.decode())
                run.seqs.append(seq)
                run.locs.append(base | offset)
                run.lens.append(length)
                run.last_ts = ts_ms
                if on_record is not None and (first or raw_type in wanted_raw):
                    etype = types.get(raw_type)
                    if etype is None:
                        etype = types[raw_type] = raw_type.decode()
                    on_record(run.run_id, etype, seq, ts_ms, buf, offset)
            report.records += outcome.next_seq - expect
            expect = outcome.next_seq
            good_end = outcome.good_end
            if outcome.end is ScanEnd.TORN_TAIL:
                cut = len(buf) - outcome.good_end
                report.torn_tail_bytes += cut
                logger.log(
                    logging.INFO if outcome.zero_tail else logging.WARNING,
                    "wal: torn tail in %s (%s): truncating %d bytes after seq %d",
                    path.name,
                    outcome.reason,
                    cut,
                    expect - 1,
                )
                with open(path, "r+b") as fh:
                    fh.truncate(outcome.good_end)
                    os.fsync(fh.fileno())
            elif outcome.end is ScanEnd.CORRUPT:
                error = CorruptLogError(
                    f"WAL corruption in {path} ({outcome.reason}); last intact seq is {expect - 1}",
                    segment=str(path),
                    offset=outcome.good_end,
                    last_good_seq=expect - 1,
                )
                if self.options.on_corruption == "fail":
                    raise error
                report.corruption = error
                self._quarantine(path, buf, outcome.good_end, paths[number + 1 :], report)
                break
        report.segments = len(self._segments)
        report.last_seq = expect - 1
        self._next_seq = expect
        if self._segments:
            self._size = good_end
            self._fd = os.open(self._segments[-1], os.O_RDWR)
            self._allocated = os.fstat(self._fd).st_size
        else:
            self._create_segment(self._next_seq)
        self._recovered = True
        report.seconds = time.monotonic() - started
        logger.info(
            "wal: recovered %d records in %d segments up to seq %d in %.3fs",
            report.records,
            report.segments,
            report.last_seq,
            report.seconds,
        )
        return report

    def _quarantine(
        self, path: Path, buf: bytes, good_end: int, later: list[Path], report: RecoveryReport
    ) -> None:
        # One fresh folder per recovery: a later corruption (seqs get reused after a
        # quarantine) must never overwrite what an earlier one preserved.
        root = self.dir / "quarantine"
        root.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        for attempt in range(1000):
            qdir = root / f"{stamp}-{attempt:03d}"
            try:
                qdir.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise OSError(f"cannot create a quarantine folder under {root}")
        _fsync_dir(root)
        kept = qdir / f"{path.name}.from-{good_end}"
        kept.write_bytes(buf[good_end:])
        with open(kept, "rb+") as fh:
            os.fsync(fh.fileno())
        report.quarantined.append(str(kept))
        for other in later:
            target = qdir / other.name
            os.replace(other, target)
            report.quarantined.append(str(target))
        _fsync_dir(qdir)
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
            os.fsync(fh.fileno())
        _fsync_dir(self.dir)
        logger.error(
            "wal: %s; the intact prefix is kept, %d bytes and %d later segments moved to %s",
            report.corruption,
            len(buf) - good_end,
            len(later),
            qdir,
        )

    def _create_segment(self, first_seq: int) -> None:
        # The segment we leave must end at its last frame, durably, before a later one
        # exists: recovery accepts zeros only where the writer may have stopped.
        self._cut_preallocation()
        path = self.dir / segment_name(first_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        _fsync_dir(self.dir)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._segments.append(path)
        self._size = 0
        self._allocated = 0

    def _cut_preallocation(self) -> None:
        """Truncate the active segment's unwritten space and make that durable."""
        if self._fd is not None and self._allocated > self._size:
            os.ftruncate(self._fd, self._size)
            os.fdatasync(self._fd)
            self._allocated = self._size

    def _preallocate_for(self, fd: int, end: int) -> None:
        """Make sure the active segment is allocated up to ``end`` (and a step ahead)."""
        if not self._preallocate or end <= self._allocated:
            return
        target = max(end, min(self._allocated + PREALLOCATE_BYTES, self.options.segment_bytes))
        try:
            os.posix_fallocate(fd, self._allocated, target - self._allocated)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            logger.info("wal: %s cannot preallocate (%s); segments grow per write", self.dir, exc)
            self._preallocate = False
            return
        self._allocated = target

    # ---------------------------------------------------------------- writer

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

        Idempotent. Blocking: joins the writer thread.
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
                self._cut_preallocation()
            except OSError as exc:
                errors.append(exc)
        with self._readers_lock:
            fds = list(self._readers.values())
            self._readers.clear()
        if self._fd is not None:
            fds.append(self._fd)
            self._fd = None
        for fd in fds:
            try:
                os.close(fd)
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

    def _commit(self, batch: list[_Pending]) -> None:
        if self._broken is not None:
            self._fail(batch, TimelineBrokenError("the WAL is broken"), self._broken)
            return
        first = self._next_seq
        try:
            if self._size >= self.options.segment_bytes:
                self._create_segment(first)
        except OSError as exc:
            logger.error("wal: cannot rotate segment: %s", exc)
            self._fail(batch, AppendFailedError("cannot rotate WAL segment"), exc)
            return
        fd = self._fd
        assert fd is not None
        seg_id = len(self._segments) - 1
        start = self._size
        try:
            if self.faults is not None:
                self.faults.before_write(first, len(batch))
            data = encode_frames(first, [pending[1] for pending in batch])
            self._preallocate_for(fd, start + len(data))
            _pwrite_all(fd, data, start)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
                self._allocated = start
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
            os.fdatasync(fd)
        except OSError as exc:
            self._broken = exc
            logger.critical("wal: fdatasync failed, the log is now read-only: %s", exc)
            self._fail(batch, TimelineBrokenError("WAL fsync failed"), exc)
            return
        self._size = start + len(data)
        self._next_seq = first + len(batch)
        stats = self.stats
        stats.fsyncs += 1
        stats.batches += 1
        stats.appended += len(batch)
        stats.last_batch_size = len(batch)
        durable = self._index(batch, first, (seg_id << OFFSET_BITS) | start)
        self._run_hook(self.hooks.on_durable, durable)
        self._confirm(batch, first)
        self._run_hook(self.hooks.after_confirm, durable)

    def _index(self, batch: list[_Pending], first: int, loc: int) -> DurableBatch:
        """Seqs become events; each goes into the index at ``loc`` (segment | offset)."""
        events: list[Event] = []
        by_run: dict[str, list[Event]] = {}
        positions_for = self.index.positions_for
        seq = first
        for (run_id, etype, principal, data, ts_ms), body, _loop, _fut, _started in batch:
            event = _new_event(Event, (seq, run_id, etype, ts_ms, principal, data))
            events.append(event)
            group = by_run.get(run_id)
            if group is None:
                by_run[run_id] = [event]
            else:
                group.append(event)
            length = len(body) + FRAME_OVERHEAD
            run = positions_for(run_id)
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

    def _confirm(self, batch: list[_Pending], first: int) -> None:
        """Tell every producer its seq: thread futures here, loop futures on their loop
        with one ``call_soon_threadsafe`` per loop and batch.

        The batch list itself goes to each loop's :meth:`_settle` (which resolves only
        that loop's futures): the writer never touches a batch again once it is handed
        over, and this pass stays one cheap look per event.
        """
        loops: list[asyncio.AbstractEventLoop] = []
        last_loop: asyncio.AbstractEventLoop | None = None
        for seq, (_event, _body, loop, fut, _started) in enumerate(batch, first):
            if loop is None:
                try:
                    fut.set_result(seq)
                except concurrent.futures.InvalidStateError:  # the caller cancelled it
                    logger.debug("wal: seq %d is durable; its future was cancelled", seq)
            elif loop is not last_loop:
                last_loop = loop
                if loop not in loops:
                    loops.append(loop)
        for loop in loops:
            try:
                loop.call_soon_threadsafe(self._settle, batch, first, loop)
            except RuntimeError:
                logger.warning("wal: a producer's event loop is closed; confirmations dropped")

    def _settle(self, batch: list[_Pending], first: int, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: resolve its producers' futures with their seqs, then record their
        confirm latencies (futures a caller cancelled are skipped)."""
        now = _monotonic()
        waited: list[float] = []
        for seq, (_event, _body, owner, fut, started) in enumerate(batch, first):
            if owner is loop:
                try:
                    fut.set_result(seq)
                except asyncio.InvalidStateError:  # the caller cancelled it
                    continue
                waited.append(now - started)
        self.confirm_latency.observe_many(waited)

    def _fail(self, batch: list[_Pending], error: RegistryError, cause: BaseException) -> None:
        self.stats.failed_batches += 1
        error.__cause__ = cause
        if self.hooks.on_failed is not None:
            try:
                self.hooks.on_failed([pending[0] for pending in batch])
            except Exception:
                logger.exception("wal: on_failed hook failed")
        by_loop: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[int], int | BaseException]]
        ] = {}
        for _event, _body, loop, fut, _started in batch:
            if loop is None:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    fut.set_exception(error)
            else:
                by_loop.setdefault(loop, []).append((cast("asyncio.Future[int]", fut), error))
        for loop, results in by_loop.items():
            try:
                loop.call_soon_threadsafe(settle_futures, results)
            except RuntimeError:
                logger.warning(
                    "wal: a producer's event loop is closed; %d failures dropped", len(results)
                )

    # ---------------------------------------------------------------- producers

    def _refuse(self) -> NoReturn:
        if self._broken is not None:
            raise TimelineBrokenError("the WAL is broken") from self._broken
        raise TimelineClosedError("the timeline is closed")

    def _encode(self, event: NewEvent) -> bytes:
        if self._broken is not None or self._queue.closed:
            self._refuse()
        return encode_body_positional(event, self._max_record_bytes)

    async def submit(self, event: NewEvent) -> asyncio.Future[int]:
        """Queue ``event``; the returned future resolves to its seq once it is durable.

        Cancellation: if cancelled while waiting for queue space, nothing was queued.
        Once this returns, the append happens whatever the caller does next.
        """
        started = _monotonic()
        body = self._encode(event)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        item: _Pending = (event, body, loop, fut, started)
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
        body = encode_body_positional(event, self._max_record_bytes)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        item: _Pending = (event, body, loop, fut, started)
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

    def _reader_fd(self, segment_id: int) -> int:
        fd = self._readers.get(segment_id)
        if fd is not None:
            return fd
        with self._readers_lock:
            fd = self._readers.get(segment_id)
            if fd is None:
                fd = os.open(self._segments[segment_id], os.O_RDONLY)
                self._readers[segment_id] = fd
            return fd

    def read_positions(self, positions: list[Position]) -> list[Event]:
        """Decode the events at ``positions`` (blocking file I/O; any thread).

        Adjacent frames of one segment are read with one ``pread``.
        """
        events: list[Event] = []
        i = 0
        while i < len(positions):
            first = positions[i]
            j = i + 1
            end = first.offset + first.length
            while (
                j < len(positions)
                and positions[j].segment_id == first.segment_id
                and positions[j].offset == end
            ):
                end += positions[j].length
                j += 1
            fd = self._reader_fd(first.segment_id)
            buf = os.pread(fd, end - first.offset, first.offset)
            pos = 0
            for k in range(i, j):
                events.append(decode_frame_at(buf, pos))
                pos += positions[k].length
            i = j
        return events

    def read_all(self) -> list[Event]:
        """Every durable event in seq order (blocking; tests and tools, not hot paths)."""
        out: list[Event] = []
        for path in list(self._segments):
            buf = path.read_bytes()
            outcome = ScanOutcome()
            expect = out[-1].seq + 1 if out else 1
            for info in scan_segment(
                buf, expect, outcome, is_last=True, max_record_bytes=self.options.max_record_bytes
            ):
                out.append(decode_frame_at(buf, info.offset))
        return out


__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "PREALLOCATE_BYTES",
    "DurableBatch",
    "RecoveryReport",
    "Wal",
    "WalFaults",
    "WalHooks",
    "WalOptions",
    "decode_payload",
    "segment_name",
]
