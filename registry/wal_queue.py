"""The WAL's bounded producer queue: between every producer and the one writer thread.

Rules:

- Capacity is fixed (1024 by default). ``put_nowait`` never blocks: it raises
  :class:`QueueFullError` and queues nothing (``offer`` returns False instead).
  ``put_blocking`` (worker threads) waits on a condition variable. ``put`` (asyncio)
  waits on a loop future, never blocking the loop.
- The writer takes *everything* queued in one call (:meth:`take_all`): that is the batch
  of a group commit. Taking wakes every waiting producer, thread or task, so no wakeup
  is lost; a cancelled task simply ignores its wakeup.
- After :meth:`close` every put raises :class:`TimelineClosedError`; items already queued
  are still handed to the writer, which drains them before it exits.

Lock order: ``_lock`` is a leaf; nothing else is acquired while holding it, and loop
futures are resolved outside it (through ``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from registry.errors import QueueFullError, TimelineClosedError


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class WalQueue[T]:
    """Bounded multi-producer, single-consumer queue with thread and asyncio producers."""

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._space_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed = False
        # Who is asleep, so that the hot path skips Condition.notify (pure Python, a
        # noticeable part of an append: docs/PERFORMANCE.md) when nobody waits. Both
        # are read and written only under _lock.
        self._consumer_waiting = False
        self._blocked_producers = 0

    def _wake_consumer(self) -> None:
        # Under _lock. Cleared here, not only when the writer wakes: until the writer
        # gets the GIL back every later put would call Condition.notify again (pure
        # Python) for nothing. The writer re-arms it before it waits.
        self._consumer_waiting = False
        self._not_empty.notify()

    @property
    def capacity(self) -> int:
        """The fixed bound."""
        return self._capacity

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        """Queue ``item`` or raise at once (full or closed)."""
        with self._lock:
            if self._closed:
                raise TimelineClosedError("the timeline is closed")
            if len(self._items) >= self._capacity:
                raise QueueFullError(f"WAL queue full ({self._capacity} pending)")
            self._items.append(item)
            if self._consumer_waiting:
                self._wake_consumer()

    def offer(self, item: T) -> bool:
        """Queue ``item`` if there is room and return True; False when full (nothing
        queued). Never blocks; raises :class:`TimelineClosedError` once closed.

        The asyncio fast path: no coroutine, no future unless the queue is full.
        """
        with self._lock:
            if self._closed:
                raise TimelineClosedError("the timeline is closed")
            if len(self._items) >= self._capacity:
                return False
            self._items.append(item)
            if self._consumer_waiting:
                self._wake_consumer()
            return True

    def put_blocking(self, item: T, timeout: float | None = None) -> None:
        """Queue ``item``, waiting for space up to ``timeout`` seconds (thread callers).

        Raises :class:`QueueFullError` on timeout, :class:`TimelineClosedError` if closed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._closed and len(self._items) >= self._capacity:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise QueueFullError(f"WAL queue full ({self._capacity} pending)")
                self._blocked_producers += 1
                try:
                    self._not_full.wait(remaining)
                finally:
                    self._blocked_producers -= 1
            if self._closed:
                raise TimelineClosedError("the timeline is closed")
            self._items.append(item)
            if self._consumer_waiting:
                self._wake_consumer()

    async def put(self, item: T) -> None:
        """Queue ``item``, awaiting space without blocking the loop.

        Cancellation: if cancelled while waiting for space, nothing was queued.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._closed:
                    raise TimelineClosedError("the timeline is closed")
                if len(self._items) < self._capacity:
                    self._items.append(item)
                    if self._consumer_waiting:
                        self._wake_consumer()
                    return
                fut: asyncio.Future[None] = loop.create_future()
                self._space_waiters.append((loop, fut))
            await fut

    def take_all(self, timeout: float | None = None) -> list[T]:
        """Writer side: wait for at least one item (or close), then take them all.

        Returns an empty list only when closed and drained, or on timeout.
        """
        with self._lock:
            if not self._items and not self._closed and timeout != 0:
                self._consumer_waiting = True
                try:
                    self._not_empty.wait(timeout)
                finally:
                    self._consumer_waiting = False
            batch = list(self._items)
            self._items.clear()
            if self._blocked_producers:
                self._not_full.notify_all()
            waiters = self._space_waiters
            self._space_waiters = []
        self._wake_async(waiters)
        return batch

    def close(self) -> None:
        """Refuse further puts and wake everyone (idempotent)."""
        with self._lock:
            self._closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()
            waiters = self._space_waiters
            self._space_waiters = []
        self._wake_async(waiters)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @staticmethod
    def _wake_async(
        waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]],
    ) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for loop, fut in waiters:
            by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_wake, futs)
            except RuntimeError:
                # The loop is closed: nobody is left to wake.
                continue
