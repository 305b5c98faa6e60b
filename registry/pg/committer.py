"""A node's group commit into the cluster store: one transaction per batch of appends.

Rules:

- **Who owns what.** One task (``whip-pg-committer``) owns the queue's consumer side and
  the one connection it writes through; producers only enqueue. :meth:`append` (loop) and
  :meth:`append_nowait` (any thread; it hops to the loop with ``call_soon_threadsafe``)
  enqueue; the task drains everything queued (at most ``max_batch``), writes it with
  :func:`registry.pg.batches.write_batch` in one transaction, and only after COMMIT
  resolves each append's future with its seq. Confirmed means committed.
- **Two kinds of append.** *Lifecycle* appends (:meth:`append`, awaited) are kept until
  they are durable: a store outage makes them wait, never drops them. *Analyzer* appends
  (:meth:`append_nowait`) share a bound (``buffer_limit``): past it they are refused at
  once and counted in :attr:`dropped` (decode never blocks on the store).
- **Exactly once.** Each batch has an id written with it. After a failure whose outcome is
  unknown (the connection broke around COMMIT) the retry first asks whether that id
  committed and, if so, confirms from the stored seqs instead of writing again.
- **Fencing.** Each append remembers the lease epoch it was made under. A batch is written
  only under the epoch the node holds *now*; appends of an older epoch fail with
  :class:`FencedError` (their runs are interrupted by whoever reaps or re-acquires), and
  while the node holds no lease, appends are refused at once with :class:`FencedError`.
- **Reservations.** An append may consume a stream-slot reservation (``run_created``):
  its batch deletes the reservation row and writes the event only if that row was there;
  otherwise the append fails with :class:`SlotLostError` (its lease epoch ended and the
  reservation was released) and the rest of the batch commits. The batch row records it
  (seq -1), so a retry after a lost COMMIT answer decides the same.
- **Retry.** Connection failures back off from 50 ms to 1 s and retry the same batch; the
  queue keeps filling behind it (analyzer appends up to their bound).
- **A bad event** (any other PostgreSQL error: the transaction rolled back, so nothing of
  the batch was written) never stops the task: the batch's appends are retried one per
  batch, and only the one the store refuses fails (:class:`AppendFailedError`, the
  driver's error chained).

Cancellation: a cancelled :meth:`append` caller loses only its answer; the event stays
queued and is written. :meth:`close` cancels the task after the queue drained or the
bound passed; appends still queued then fail with :class:`TimelineClosedError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from registry.errors import AppendFailedError, QueueFullError, RegistryError, TimelineClosedError
from registry.events import Event, NewEvent
from registry.histogram import BATCH_SIZES, LATENCY_S, Histogram
from registry.pg.batches import (
    FencedError,
    Writer,
    check_lease,
    committed_seqs,
    rebuild,
    record_batch,
    write_batch,
)

logger = logging.getLogger(__name__)

DEFAULT_BUFFER_LIMIT = 10_000
DEFAULT_MAX_BATCH = 1024
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
    TimeoutError,
)
"""What "the store is unreachable, or cannot take it now" looks like to asyncpg: the
connection broke (the outcome of a COMMIT in flight is unknown), the server is shutting
down or out of connections, or the transaction was chosen as a deadlock or serialization
victim. Each is retried (after asking whether the batch committed)."""


class SlotLostError(RegistryError):
    """The stream-slot reservation a ``run_created`` was to consume no longer exists."""

    http_status = 503
    code = "stream_slot_lost"


@dataclass(slots=True)
class _Pending:
    event: NewEvent
    epoch: int
    future: asyncio.Future[int] | concurrent.futures.Future[int]
    lifecycle: bool
    queued_at: float
    reservation: str | None = None


def _settle(future: asyncio.Future[int] | concurrent.futures.Future[int], seq: int) -> None:
    if not future.done():
        future.set_result(seq)


def _fail(future: asyncio.Future[int] | concurrent.futures.Future[int], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class GroupCommitter:
    """The node's append path into PostgreSQL (see the module rules)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        writer: Callable[[], Writer | None],
        on_durable: Callable[[list[Event]], None],
        *,
        node_id: str,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._connect = connect
        self._node_id = node_id
        self._writer = writer
        self._on_durable = on_durable
        self._buffer_limit = buffer_limit
        self._max_batch = max_batch
        self._queue: deque[_Pending] = deque()
        self._analyzer_count = 0
        self._count_lock = threading.Lock()
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._closed = False
        self._isolate = 0
        """Batches still to take one append at a time (after a refused batch)."""
        self.refused = 0
        """Appends the store refused (a bad event), each failed with AppendFailedError."""
        self.dropped = 0
        """Analyzer appends refused because the buffer was full (since start)."""
        self.connected = False
        """The last batch attempt reached the store (False during an outage)."""
        self.batch_sizes = Histogram(BATCH_SIZES)
        self.commit_latency = Histogram(LATENCY_S)
        """Seconds of one batch's transaction (BEGIN to COMMIT answered)."""
        self.confirm_latency = Histogram(LATENCY_S)
        """Seconds from append to its confirmation."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the committer task on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="whip-pg-committer")

    async def close(self, drain_s: float = 5.0) -> None:
        """Drain what is queued (up to ``drain_s``), then stop; idempotent."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + drain_s
            while self._queue and not task.done() and loop.time() < deadline:
                self._wakeup.set()
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        closed = TimelineClosedError("the cluster timeline is closed")
        while self._queue:
            _fail(self._queue.popleft().future, closed)
        if self._conn is not None:
            await self._close_conn()

    async def _close_conn(self) -> None:
        """Drop the connection: a broken one is terminated, never waited on."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ appends

    def _epoch_now(self) -> int:
        writer = self._writer()
        if writer is None:
            raise FencedError("this node holds no lease: appends are refused")
        return writer.epoch

    def append(self, event: NewEvent, reservation: str | None = None) -> asyncio.Future[int]:
        """Queue a lifecycle append; the future resolves with its seq once committed.

        Raises :class:`FencedError` at once when the node holds no lease,
        :class:`TimelineClosedError` after :meth:`close`. Cancellation: see module doc.
        """
        if self._closed:
            raise TimelineClosedError("the cluster timeline is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        item = _Pending(event, self._epoch_now(), future, True, time.monotonic(), reservation)
        self._queue.append(item)
        self._wakeup.set()
        return future

    def append_nowait(self, event: NewEvent) -> concurrent.futures.Future[int]:
        """Queue an analyzer append from any thread; never blocks.

        Raises :class:`QueueFullError` (and counts a drop) past ``buffer_limit``,
        :class:`FencedError` while the node holds no lease.
        """
        if self._closed or self._loop is None:
            raise TimelineClosedError("the cluster timeline is closed")
        epoch = self._epoch_now()
        with self._count_lock:
            if self._analyzer_count >= self._buffer_limit:
                self.dropped += 1
                raise QueueFullError("the cluster store's analyzer buffer is full")
            self._analyzer_count += 1
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        item = _Pending(event, epoch, future, False, time.monotonic())
        self._loop.call_soon_threadsafe(self._enqueue, item)
        return future

    def _enqueue(self, item: _Pending) -> None:
        self._queue.append(item)
        self._wakeup.set()

    # ------------------------------------------------------------------ the task

    async def _run(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            size = 1 if self._isolate else min(len(self._queue), self._max_batch)
            self._isolate = max(0, self._isolate - 1)
            batch = [self._queue.popleft() for _ in range(size)]
            batch_id = uuid.uuid4()  # kept across this batch's retries (exactly once)
            attempts = 0
            try:
                while True:
                    try:
                        attempts += 1
                        await self._commit(batch_id, batch, retry=attempts > 1)
                        break
                    except CONNECTION_ERRORS as exc:
                        self.connected = False
                        logger.warning(
                            "node %s: batch of %d not committed yet: %r",
                            self._node_id,
                            len(batch),
                            exc,
                        )
                        await self._close_conn()
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, RETRY_MAX_S)
                    except asyncpg.PostgresError as exc:
                        self._refused_batch(batch, exc)
                        break
                    except Exception:  # the driver broke some other way: never stop the task
                        logger.exception(
                            "node %s: batch of %d failed unexpectedly; retrying",
                            self._node_id,
                            len(batch),
                        )
                        await self._close_conn()
                        await asyncio.sleep(RETRY_MAX_S)
            except BaseException:
                self._queue.extendleft(reversed(batch))  # close() fails what is left
                raise
            delay = RETRY_FIRST_S

    def _refused_batch(self, batch: list[_Pending], exc: asyncpg.PostgresError) -> None:
        """The store refused the batch (rolled back): isolate the culprit (module doc)."""
        if len(batch) > 1:
            logger.warning(
                "node %s: a batch of %d was refused (%r): retrying one by one",
                self._node_id,
                len(batch),
                exc,
            )
            self._queue.extendleft(reversed(batch))
            self._isolate = len(batch)
            return
        (item,) = batch
        self.refused += 1
        logger.error(
            "node %s run %s: %s refused by the cluster store: %r",
            self._node_id,
            item.event.run_id,
            item.event.type,
            exc,
        )
        failure = AppendFailedError(f"the cluster store refused the event: {exc}")
        failure.__cause__ = exc
        _fail(item.future, failure)
        self._release(batch)

    def _release(self, batch: list[_Pending]) -> None:
        analyzer = sum(1 for item in batch if not item.lifecycle)
        if analyzer:
            with self._count_lock:
                self._analyzer_count -= analyzer

    async def _commit(self, batch_id: uuid.UUID, batch: list[_Pending], *, retry: bool) -> None:
        """Settle ``batch`` (its id kept across retries; only a ``retry`` asks the store
        whether an earlier attempt committed); raises :data:`CONNECTION_ERRORS` and the
        store's refusals. Items dropped as stale leave ``batch`` in place, so a retry after
        a lost COMMIT answer sees the batch as it was written."""
        while batch:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncio.wait_for(self._connect(), 5.0)
            conn: asyncpg.Connection = self._conn
            self.connected = True
            seqs = await committed_seqs(conn, self._node_id, batch_id) if retry else None
            if seqs is None:
                writer = self._writer()
                stale = [item for item in batch if writer is None or item.epoch != writer.epoch]
                if stale:
                    fenced = FencedError("the lease epoch of these appends has ended")
                    for item in stale:
                        _fail(item.future, fenced)
                    self._release(stale)
                    batch[:] = [item for item in batch if item not in stale]
                    continue
                assert writer is not None
                started = time.monotonic()
                try:
                    async with conn.transaction():
                        await check_lease(conn, writer)
                        kept = await self._consume_reservations(conn, batch)
                        events = [
                            item.event for item, keep in zip(batch, kept, strict=True) if keep
                        ]
                        written = await write_batch(conn, writer, events) if events else []
                        seqs = _aligned(kept, [event.seq for event in written])
                        await record_batch(conn, batch_id, writer, seqs)
                except FencedError:
                    # The epoch ended under us: drop the lease view's answer, fail the
                    # batch's items on the next turn (their epoch is stale by then).
                    if self._writer() == writer:
                        await asyncio.sleep(RETRY_FIRST_S)
                    continue
                self.commit_latency.observe(time.monotonic() - started)
            self._settle_batch(batch, seqs)
            return

    @staticmethod
    async def _consume_reservations(conn: asyncpg.Connection, batch: list[_Pending]) -> list[bool]:
        """Which items to write: all, except those whose reservation is gone."""
        wanted = [item.reservation for item in batch if item.reservation is not None]
        if not wanted:
            return [True] * len(batch)
        found = set(
            await conn.fetchval(
                "WITH d AS (DELETE FROM whip_stream_slots"
                " WHERE reservation_id = ANY($1::text[]) RETURNING reservation_id)"
                " SELECT coalesce(array_agg(reservation_id), '{}') FROM d",
                wanted,
            )
        )
        return [item.reservation is None or item.reservation in found for item in batch]

    def _settle_batch(self, batch: list[_Pending], seqs: list[int]) -> None:
        now = time.monotonic()
        self.batch_sizes.observe(len(batch))
        self._release(batch)
        self._on_durable(rebuild(batch_events(batch, seqs), [s for s in seqs if s > 0]))
        for item, seq in zip(batch, seqs, strict=True):
            self.confirm_latency.observe(now - item.queued_at)
            if seq < 0:
                _fail(
                    item.future, SlotLostError("the stream slot was released (lease epoch ended)")
                )
            elif isinstance(item.future, asyncio.Future):
                _settle(item.future, seq)
            else:
                item.future.set_result(seq)


def _aligned(kept: list[bool], written: list[int]) -> list[int]:
    """One seq per batch item, -1 where the item was not written."""
    seqs = iter(written)
    return [next(seqs) if keep else -1 for keep in kept]


def batch_events(batch: list[_Pending], seqs: list[int]) -> list[NewEvent]:
    """The events of the items that were written."""
    return [item.event for item, seq in zip(batch, seqs, strict=True) if seq > 0]
