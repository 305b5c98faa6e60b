"""The WAL's producer queue (:mod:`registry.wal_queue`): bounded, batch-taking, closable."""

from __future__ import annotations

import asyncio
import threading

import pytest

from registry.errors import QueueFullError, TimelineClosedError
from registry.wal_queue import WalQueue


def test_capacity_is_a_hard_bound_for_the_non_blocking_puts() -> None:
    queue: WalQueue[int] = WalQueue(2)
    assert (queue.capacity, queue.offer(1), queue.offer(2), queue.offer(3)) == (
        2,
        True,
        True,
        False,
    )
    with pytest.raises(QueueFullError):
        queue.put_nowait(4)
    with pytest.raises(QueueFullError):
        queue.put_blocking(4, timeout=0.01)
    assert (len(queue), queue.take_all(timeout=0)) == (2, [1, 2])
    assert queue.take_all(timeout=0) == []
    with pytest.raises(ValueError):
        WalQueue(0)


def test_taking_the_batch_wakes_a_blocked_thread_producer() -> None:
    queue: WalQueue[str] = WalQueue(1)
    queue.put_nowait("first")
    blocked = threading.Event()
    history: list[str] = []

    def producer() -> None:
        blocked.set()
        queue.put_blocking("second")
        history.append("queued")

    thread = threading.Thread(target=producer, name="test-producer")
    thread.start()
    blocked.wait()
    history.append("taking")
    assert queue.take_all() == ["first"]
    thread.join(5)
    assert history == ["taking", "queued"]
    assert queue.take_all() == ["second"]


async def test_an_async_producer_waits_for_space_without_blocking_the_loop() -> None:
    queue: WalQueue[int] = WalQueue(1)
    queue.put_nowait(1)
    put = asyncio.create_task(queue.put(2), name="test-put")
    await asyncio.sleep(0)  # one loop iteration: the task runs up to its wait for space
    assert not put.done()
    assert await asyncio.to_thread(queue.take_all) == [1]
    await asyncio.wait_for(put, 5)
    assert queue.take_all(timeout=0) == [2]


async def test_a_cancelled_async_put_queues_nothing() -> None:
    queue: WalQueue[int] = WalQueue(1)
    queue.put_nowait(1)
    put = asyncio.create_task(queue.put(2), name="test-put")
    await asyncio.sleep(0)  # one loop iteration: the task runs up to its wait for space
    assert not put.done()
    put.cancel()
    with pytest.raises(asyncio.CancelledError):
        await put
    assert queue.take_all(timeout=0) == [1]
    assert queue.take_all(timeout=0) == []


async def test_close_refuses_puts_and_hands_what_was_queued_to_the_writer() -> None:
    queue: WalQueue[int] = WalQueue(1)
    queue.put_nowait(1)
    waiting = asyncio.create_task(queue.put(2), name="test-put")
    await asyncio.sleep(0)  # one loop iteration: the task runs up to its wait for space
    assert not waiting.done()
    queue.close()
    queue.close()  # idempotent
    with pytest.raises(TimelineClosedError):
        await waiting
    for put in (queue.put_nowait, queue.offer, queue.put_blocking):
        with pytest.raises(TimelineClosedError):
            put(3)
    assert queue.closed and queue.take_all() == [1]
    assert queue.take_all() == []  # closed and drained: the writer exits
