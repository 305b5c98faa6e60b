"""Group-commit confirmations (:mod:`registry.confirmations`): every producer learns its
seq or its batch's failure exactly once, on its own loop or thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

import pytest

from registry.confirmations import PendingAppend, confirm_batch, fail_batch, settle_futures
from registry.errors import AppendFailedError
from registry.events import NewEvent
from registry.histogram import LATENCY_S, Histogram

EVENT = NewEvent("r", "stats", "p", {}, 1)


def _on_writer_thread(fn: object, *args: object) -> None:
    """Run ``fn(*args)`` on another thread, as the WAL writer does, and wait for it."""
    thread = threading.Thread(target=fn, args=args, name="test-writer")  # type: ignore[arg-type]
    thread.start()
    thread.join()


async def test_each_producer_gets_its_own_seq_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    loop_futs: list[asyncio.Future[int]] = [loop.create_future() for _ in range(3)]
    thread_futs: list[concurrent.futures.Future[int]] = [
        concurrent.futures.Future() for _ in range(2)
    ]
    batch: list[PendingAppend] = [
        (EVENT, b"", loop, loop_futs[0], 0.0),
        (EVENT, b"", None, thread_futs[0], 0.0),
        (EVENT, b"", loop, loop_futs[1], 0.0),
        (EVENT, b"", None, thread_futs[1], 0.0),
        (EVENT, b"", loop, loop_futs[2], 0.0),
    ]
    loop_futs[1].cancel()  # its caller went away: skipped, the rest still confirmed
    thread_futs[1].cancel()
    latency = Histogram(LATENCY_S)
    _on_writer_thread(confirm_batch, batch, 41, latency)
    assert [f.result() for f in thread_futs[:1]] == [42]
    assert thread_futs[1].cancelled()
    assert [await loop_futs[0], await loop_futs[2]] == [41, 45]
    assert latency.read().count == 2  # one per resolved loop future


async def test_a_failed_batch_fails_every_producer_with_the_cause_chained() -> None:
    loop = asyncio.get_running_loop()
    loop_fut: asyncio.Future[int] = loop.create_future()
    thread_fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    error = AppendFailedError("WAL write failed; nothing was appended")
    error.__cause__ = OSError(28, "No space left on device")
    batch: list[PendingAppend] = [
        (EVENT, b"", loop, loop_fut, 0.0),
        (EVENT, b"", None, thread_fut, 0.0),
    ]
    _on_writer_thread(fail_batch, batch, error)
    with pytest.raises(AppendFailedError) as info:
        await loop_fut
    assert isinstance(info.value.__cause__, OSError)
    assert thread_fut.exception() is error


def test_a_closed_loop_drops_its_confirmations_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    fut: asyncio.Future[int] = loop.create_future()
    loop.close()
    batch: list[PendingAppend] = [(EVENT, b"", loop, fut, 0.0)]
    with caplog.at_level(logging.WARNING, logger="registry.confirmations"):
        confirm_batch(batch, 1, Histogram(LATENCY_S))
        fail_batch(batch, AppendFailedError("x"))
    assert [r.getMessage() for r in caplog.records] == [
        "wal: a producer's event loop is closed; confirmations dropped",
        "wal: a producer's event loop is closed; 1 failures dropped",
    ]
    assert not fut.done()


async def test_settle_futures_skips_futures_already_done() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    done.cancel()
    pending: asyncio.Future[int] = loop.create_future()
    failing: asyncio.Future[int] = loop.create_future()
    settle_futures([(done, 1), (pending, 2), (failing, AppendFailedError("no"))])
    assert done.cancelled() and pending.result() == 2
    assert isinstance(failing.exception(), AppendFailedError)
