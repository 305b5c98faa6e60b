"""Detached work: tasks a caller's cancellation cannot reach.

A client that hangs up mid-request cancels its handler. The session transaction, a
close, a stop or a delete must not stop half-way because of that, so they run as
*detached* tasks: :meth:`DetachedTasks.run` awaits one through ``asyncio.shield`` (the
caller stops waiting; the task runs to completion) and :meth:`DetachedTasks.detach`
starts one nobody awaits. Every detached task is kept (a strong reference, so it is never
garbage-collected mid-flight) until it finishes, so shutdown can wait for them all.

Loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DetachedTasks:
    """The detached tasks of one owner (module doc)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def detach(self, coro: Awaitable[T], name: str) -> asyncio.Task[T]:
        """Start ``coro`` as a named task the caller's cancellation cannot reach."""
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run(self, coro: Awaitable[T], name: str) -> T:
        """Await ``coro`` in a detached task. Cancellation: the caller stops waiting; the
        task runs to completion."""
        return await asyncio.shield(self.detach(coro, name))

    def pending(self) -> list[asyncio.Task[Any]]:
        """The detached tasks not finished yet."""
        return [task for task in self._tasks if not task.done()]

    async def wait(self, timeout_s: float) -> list[asyncio.Task[Any]]:
        """Wait up to ``timeout_s`` for every pending task; return those still pending.

        Cancellation: only the wait is abandoned; the tasks run on."""
        pending = self.pending()
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        return self.pending()
