"""Long-poll wakeups: "tell me when run R has events after seq N".

No lost wakeup, by construction:

1. the waiter registers its future *before* it reads the snapshot;
2. the writer publishes the new snapshot *before* it calls :meth:`WaitHub.notify`.

So an event made durable between the reader's check and its wait either is in the
snapshot the reader sees after registering, or its notify finds the registered future.
The writer thread calls :meth:`notify`; futures are resolved on their own loops through
``call_soon_threadsafe``. ``_lock`` is a leaf lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable


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
