"""Long-poll wakeups: "tell me when run R has events after seq N".

No lost wakeup, by construction:

1. the waiter registers its future *before* it reads the snapshot;
2. the writer publishes the new snapshot *before* it calls :meth:`WaitHub.notify`.

So an event made durable between the reader's check and its wait either is in the
snapshot the reader sees after registering, or its notify finds the registered future.
The writer thread calls :meth:`notify`; futures are resolved on their own loops through
``call_soon_threadsafe``. ``_lock`` is a leaf lock.

:func:`long_poll` is that protocol as one loop, shared by the embedded timeline and the
cluster store (whose LISTEN link calls :meth:`WaitHub.notify` once an event is committed).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable

from registry.errors import InvalidCursorError

MAX_WAIT_S = 60.0
"""The longest long-poll a caller may ask for."""


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class WaitHub:
    """Per-run registries of loop futures waiting for the next durable event."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._loops: dict[asyncio.Future[None], asyncio.AbstractEventLoop] = {}

    def register(self, run_id: str) -> asyncio.Future[None]:
        """A future that resolves at the next durable event of ``run_id`` (loop only)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.setdefault(run_id, set()).add(fut)
            self._loops[fut] = loop
        return fut

    def unregister(self, run_id: str, fut: asyncio.Future[None]) -> None:
        """Forget a future (idempotent)."""
        with self._lock:
            waiting = self._waiters.get(run_id)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self._waiters[run_id]
            self._loops.pop(fut, None)

    def notify(self, run_ids: Iterable[str]) -> None:
        """Wake every waiter of these runs (writer thread, after publishing)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        with self._lock:
            if not self._waiters:
                return
            for run_id in set(run_ids):
                waiting = self._waiters.pop(run_id, None)
                if not waiting:
                    continue
                for fut in waiting:
                    loop = self._loops.pop(fut)
                    by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_wake, futs)
            except RuntimeError:
                continue

    def waiting(self) -> int:
        """How many futures are registered."""
        with self._lock:
            return len(self._loops)

    def notify_all(self) -> None:
        """Wake every registered waiter (the cluster store's LISTEN link came back: any
        notification may have been lost, so every waiter re-reads)."""
        with self._lock:
            run_ids = list(self._waiters)
        self.notify(run_ids)


def check_wait(wait_s: object) -> float:
    """``wait_s`` as seconds, or :class:`InvalidCursorError` (400)."""
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float):
        raise InvalidCursorError("wait must be a number of seconds")
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise InvalidCursorError(f"wait must be between 0 and {MAX_WAIT_S:g} seconds")
    return float(wait_s)


async def long_poll[T](
    hub: WaitHub, run_id: str, read: Callable[[], Awaitable[list[T]]], wait_s: float
) -> list[T]:
    """What ``read()`` returns once it is not empty, waiting up to ``wait_s`` seconds for a
    wakeup of ``run_id`` between reads (module rules: register, then read); an empty list
    on timeout. ``wait_s`` is checked first (:func:`check_wait`).

    Cancellation: the registered future is dropped; nothing else changes."""
    check_wait(wait_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        fut = hub.register(run_id)
        try:
            found = await read()
            remaining = deadline - loop.time()
            if found or remaining <= 0:
                return found
            try:
                async with asyncio.timeout(remaining):
                    await fut
            except TimeoutError:
                return []
        finally:
            hub.unregister(run_id, fut)
