"""The webhooks' own event loop, on its own thread: where every dispatcher runs.

Why: a delivery cost its loop about a millisecond of CPU (aiohttp's client, signing,
reading the timeline; measured before the attempts moved to a child and to
:mod:`whip.webhooks.http_client`). On the server's loop that time is spent between the
appends' confirmations; on a loop of their own, the webhooks share only the GIL with
ingest, which the interpreter hands over at least every switch interval, and the
server's loop never queues behind a webhook's callbacks.

Rules:

- One thread (``webhook-delivery``) runs one loop (the server's ``server.event_loop``
  kind) from :meth:`DeliveryThread.start` to :meth:`DeliveryThread.stop`. Everything a
  dispatcher owns is created and touched on it; other threads hand it coroutines with
  :meth:`DeliveryThread.run` and read only what the dispatchers document as readable from
  anywhere (:meth:`~whip.webhooks.dispatcher.WebhookDispatcher.status`).
- The thread reaches the timeline through thread-safe paths only: snapshot reads (no
  lock), cold reads in its loop's executor, and the feed, which wakes it with
  ``call_soon_threadsafe`` (:mod:`registry.feed`).
- :meth:`stop` stops the loop, cancels what is left on it, shuts its executor down and
  joins the thread within a deadline; a thread that misses it is reported and left (it
  is a daemon: it cannot keep the process alive).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from whip.eventloop import EventLoopKind, new_event_loop

logger = logging.getLogger(__name__)

JOIN_DEADLINE_S = 10.0


class DeliveryThread:
    """A named thread running its own event loop (module rules)."""

    def __init__(self, kind: EventLoopKind) -> None:
        self._kind = kind
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def _main(self) -> None:
        loop = new_event_loop(self._kind)
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            pending = asyncio.all_tasks(loop)
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    async def start(self) -> None:
        """Start the thread and wait until its loop runs.

        Cancellation: the thread may be left starting; :meth:`stop` still stops it.
        """
        thread = threading.Thread(target=self._main, name="webhook-delivery", daemon=True)
        self._thread = thread
        thread.start()
        await asyncio.to_thread(self._ready.wait)

    async def run[T](self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the delivery loop and await its result from the caller's loop.

        Cancellation: the task on the delivery loop is cancelled too.
        """
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the webhook delivery thread is not running")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
        return await asyncio.wrap_future(future)

    async def stop(self) -> None:
        """Stop the loop and join the thread (idempotent).

        Cancellation: the join goes on in its own thread; the loop is stopping anyway.
        """
        loop, thread = self._loop, self._thread
        self._loop = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, JOIN_DEADLINE_S)
        if thread.is_alive():
            logger.error(
                "webhook delivery thread still running %.0f s after stop; left detached",
                JOIN_DEADLINE_S,
            )
