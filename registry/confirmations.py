"""Group-commit confirmations: how each producer of a batch learns its seq or its failure.

Rules:

- Every append is queued as a :data:`PendingAppend`; its future is resolved exactly
  once, by the writer thread's batch (never by the producer).
- A thread producer's :class:`concurrent.futures.Future` is resolved on the writer
  thread. An asyncio producer's future is resolved only on its own loop: one
  ``call_soon_threadsafe`` per loop and batch, which hands the batch list itself to
  that loop (the writer never touches a batch again once it is handed over).
- A future the caller cancelled is skipped (the event is durable all the same). A loop
  that is already closed cannot be told: its confirmations are dropped with a warning.
- Confirm latency (append start to the future resolved on its loop) is observed once
  per batch and loop; thread producers are not timed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from operator import itemgetter
from typing import cast

from registry.errors import RegistryError
from registry.events import NewEvent
from registry.histogram import Histogram

logger = logging.getLogger(__name__)

PendingAppend = tuple[
    NewEvent,
    bytes,
    asyncio.AbstractEventLoop | None,
    "asyncio.Future[int] | concurrent.futures.Future[int]",
    float,
]
"""What a producer queues: ``(event, encoded body, loop or None, future, monotonic start)``.

A plain tuple rather than a class: one is built per append, on the hot path. ``loop`` is
None for thread producers, whose future is a :class:`concurrent.futures.Future`."""

_monotonic = time.monotonic
_loop_of = itemgetter(2)


def settle_futures(results: list[tuple[asyncio.Future[int], int | BaseException]]) -> None:
    """Resolve loop futures with seqs or errors (runs on their loop; skips done ones)."""
    for fut, result in results:
        if fut.done():
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


def confirm_batch(batch: list[PendingAppend], first: int, latency: Histogram) -> None:
    """Tell every producer of a durable batch its seq (``first`` is the batch's first).

    Writer thread: thread futures here, loop futures through one
    ``call_soon_threadsafe`` per loop. Which loops the batch holds is one C-level pass
    (a set of the items' loops); only a batch with thread producers is walked in Python.
    """
    loops = set(map(_loop_of, batch))
    if None in loops:
        loops.discard(None)
        for seq, (_event, _body, loop, fut, _started) in enumerate(batch, first):
            if loop is None:
                try:
                    fut.set_result(seq)
                except concurrent.futures.InvalidStateError:  # the caller cancelled it
                    logger.debug("wal: seq %d is durable; its future was cancelled", seq)
    for loop in loops:
        try:
            loop.call_soon_threadsafe(_settle_on_loop, batch, first, loop, latency)
        except RuntimeError:
            logger.warning("wal: a producer's event loop is closed; confirmations dropped")


def _settle_on_loop(
    batch: list[PendingAppend],
    first: int,
    loop: asyncio.AbstractEventLoop,
    latency: Histogram,
) -> None:
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
    latency.observe_many(waited)


def fail_batch(batch: list[PendingAppend], error: RegistryError) -> None:
    """Tell every producer of a batch that failed: ``error`` (its cause already set)."""
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
