"""Many producers at once: every confirmed seq is on disk, exactly once, in order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from registry.errors import QueueFullError
from registry.events import NewEvent
from registry.timeline import Timeline

THREADS = 8
TASKS = 200
PER_THREAD = 150
PER_TASK = 20


async def test_threads_and_tasks_confirmed_seqs_are_durable_once_and_in_order(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    data_dir = tmp_path / "d"
    timeline = await asyncio.to_thread(timeline_factory, data_dir)
    confirmed: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(THREADS + 1)

    def thread_producer(t: int) -> None:
        start.wait()
        for i in range(PER_THREAD):
            marker = f"t{t}-{i}"
            event = NewEvent(f"run-t{t % 3}", "stats", "p", {"m": marker})
            if i % 3 == 0:
                try:
                    seq = timeline.append_nowait(event).result(30)
                except QueueFullError:
                    seq = timeline.append_blocking(event, 30)
            else:
                seq = timeline.append_blocking(event, 30)
            with lock:
                confirmed[marker] = seq

    async def task_producer(k: int) -> None:
        for i in range(PER_TASK):
            marker = f"a{k}-{i}"
            seq = await timeline.append(NewEvent(f"run-a{k % 7}", "stats", "p", {"m": marker}))
            confirmed[marker] = seq

    threads = [
        threading.Thread(target=thread_producer, args=(t,), name=f"producer-{t}")
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    await asyncio.to_thread(start.wait)
    await asyncio.gather(*(task_producer(k) for k in range(TASKS)))
    await asyncio.to_thread(lambda: [t.join(60) for t in threads])

    total = THREADS * PER_THREAD + TASKS * PER_TASK
    assert len(confirmed) == total
    assert len(set(confirmed.values())) == total, "two appends confirmed with the same seq"
    assert timeline.wal.stats.fsyncs < total, "no group commit happened"
    synced = timeline.sync_latency.read()
    assert synced.count == timeline.wal.stats.fsyncs, "a group commit's fdatasync went untimed"
    assert synced.total > 0

    await timeline.aclose()
    reopened = await asyncio.to_thread(timeline_factory, data_dir)
    on_disk = await asyncio.to_thread(reopened.wal.read_all)
    assert [e.seq for e in on_disk] == list(range(1, total + 1))
    by_marker = {e.data["m"]: e.seq for e in on_disk}
    assert len(by_marker) == total, "an event was written twice"
    assert by_marker == confirmed


async def test_a_full_queue_refuses_nowait_and_blocks_the_others_without_losing_any(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    gate = threading.Event()
    stalled = threading.Event()

    class SlowDisk:
        def before_write(self, first_seq: int, count: int) -> None:
            stalled.set()
            gate.wait(30)

        def before_fsync(self) -> None:
            return None

    timeline = await asyncio.to_thread(
        timeline_factory, tmp_path / "d", faults=SlowDisk(), queue_capacity=8
    )
    # The writer takes the first event and stalls in before_write; fill the queue behind.
    first = timeline.append_nowait(NewEvent("r", "stats", "p", {"i": -1}))
    assert await asyncio.to_thread(stalled.wait, 10)
    queued = []
    while True:
        try:
            queued.append(timeline.append_nowait(NewEvent("r", "stats", "p", {"i": len(queued)})))
        except QueueFullError:
            break
    assert len(queued) == 8
    waiting = [
        asyncio.create_task(timeline.append(NewEvent("r", "stats", "p", {"w": i})))
        for i in range(20)
    ]
    try:
        await asyncio.sleep(0)
        assert not any(t.done() for t in waiting)
        assert timeline.wal.queue_depth == 8
    finally:
        gate.set()
    seqs = await asyncio.gather(*waiting)
    assert first.result(10) == 1
    everything = [first.result(10)] + [f.result(10) for f in queued] + list(seqs)
    assert sorted(everything) == list(range(1, len(everything) + 1))
