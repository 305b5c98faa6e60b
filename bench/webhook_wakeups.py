#!/usr/bin/env python3
"""Wake-ups and CPU that webhooks add to the server's threads, and the delivery process's own.

Prints one JSON document on stdout; progress goes to stderr.

Why: ``bench/webhooks.py`` measures what webhooks add to the appends' confirm latency, and
on a 2-core VM its rounds move by more than the 5 % it looks for. What the scheduler
counts does not move that way: each thread's CPU time and its timeslices (one per time it
was put on a CPU, so a wake-up from sleep counts one) from ``/proc/<pid>/task/<tid>/
schedstat``. This bench reads them around the same ingest mix (``bench/webhooks.py``'s
``ingest_mix``: 100 appends/s from 16 producers, every 10th wanted, a real timeline with
its WAL and ``fdatasync``; 10 webhooks to the bench's raw receiver child).

Sections:

- ``wake_cost``: what one wake-up from a sleep costs this host in CPU, on a thread
  (``time.sleep``) and on an asyncio loop (``asyncio.sleep``), by the thread's CPU clock.
  On the 2-core VM these figures were measured on, a loop woken every 10 ms spent about
  190 µs a wake-up and every 1 ms about 65 µs, against 4 µs an iteration without sleeping:
  a thread's first instructions after an idle spell run from cold caches. That is why
  wake-ups, not work, dominate the per-event CPU of a lightly loaded server.
- ``rounds`` (``--rounds``, each with windows of ``--appends`` appends): ``none`` (no
  webhook, no delivery process), ``webhooks`` (a delivery process started for the round,
  delivering live) and ``stopped`` (the same process ``SIGSTOP``ped: the server's side
  alone, its fan-out's frames and the governor). The order is reversed every round. Per
  window: the loop thread's and the WAL writer's CPU microseconds, microseconds runnable but
  waiting for a CPU (``wait``: the schedstat's run delay, what a busy core adds to a
  wake-up) and timeslices an append, and the mean confirm latency (ms); in ``webhooks``
  also the child's CPU and timeslices a delivery, its window and catch-up together.
- ``pooled``: per mode, the windows' figures summed (CPU, wait and timeslices an append,
  or CPU and timeslices a delivery, over all rounds).

Usage::

    .venv/bin/python bench/webhook_wakeups.py              # 3 rounds of 1,000 appends
    .venv/bin/python bench/webhook_wakeups.py --quick      # 1 round of 300
    .venv/bin/python bench/webhook_wakeups.py --receiver-idle  # the receiver at SCHED_IDLE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.webhooks as webhooks_bench
from bench.support.interleaved_webhooks import delivered, wait_remote_cursors
from registry.timeline import Timeline, TimelineConfig
from whip.webhooks.child_priority import thread_ids
from whip.webhooks.delivery_process import DeliveryProcess
from whip.webhooks.group import FEED_GATHER_S

MODES = ("none", "webhooks", "stopped")
PRODUCERS = 16


def log(message: str) -> None:
    print(f"[bench/webhook_wakeups {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)


def schedstat(pid: int, tid: int | None = None) -> tuple[int, int, int]:
    """CPU nanoseconds, nanoseconds runnable but waiting for a CPU, and timeslices of one
    thread (``tid``) or of every thread of ``pid``."""
    tids = [tid] if tid is not None else thread_ids(pid)
    cpu_ns = wait_ns = slices = 0
    for one in tids:
        with open(f"/proc/{pid}/task/{one}/schedstat") as stat:
            fields = stat.read().split()
        cpu_ns += int(fields[0])
        wait_ns += int(fields[1])
        slices += int(fields[2])
    return cpu_ns, wait_ns, slices


def thread_named(name: str) -> int:
    """The kernel id of this process's Python thread called ``name``."""
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            return thread.native_id
    raise LookupError(f"no thread {name!r}")


def per(amount: float, count: int, digits: int = 1) -> float | None:
    return round(amount / count, digits) if count else None


async def wake_cost(seconds: float) -> dict[str, float | None]:
    """CPU microseconds a wake-up from each kind of sleep (module doc)."""
    out: dict[str, float | None] = {}
    for interval in (0.01, 0.001):
        count = int(seconds / interval)
        started = time.thread_time_ns()
        for _ in range(count):
            await asyncio.sleep(interval)
        out[f"asyncio_sleep_{interval:g}_s_us"] = per(
            (time.thread_time_ns() - started) / 1e3, count
        )
    started = time.thread_time_ns()
    for _ in range(2000):
        await asyncio.sleep(0)
    out["asyncio_sleep_0_us"] = per((time.thread_time_ns() - started) / 1e3, 2000)
    spent: list[float] = []

    def sleeper() -> None:
        count = int(seconds / 0.01)
        begun = time.thread_time_ns()
        for _ in range(count):
            time.sleep(0.01)
        spent.append((time.thread_time_ns() - begun) / 1e3 / count)

    thread = threading.Thread(target=sleeper, name="wake-cost")
    thread.start()
    await asyncio.to_thread(thread.join)
    out["thread_sleep_0.01_s_us"] = round(spent[0], 1)
    return out


class Counters:
    """This process's loop thread and WAL writer, read around a window."""

    def __init__(self, writer_tid: int) -> None:
        self.threads = {"loop": threading.get_native_id(), "wal_writer": writer_tid}

    def read(self) -> dict[str, tuple[int, int, int]]:
        return {name: schedstat(os.getpid(), tid) for name, tid in self.threads.items()}


async def window(
    timeline: Timeline, counters: Counters, appends: int
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """One measured ingest-mix window: its figures, and its sums for pooling."""
    before = counters.read()
    latencies = await webhooks_bench.ingest_mix(timeline, appends, PRODUCERS)
    after = counters.read()
    figures: dict[str, Any] = {"mean_ms": round(1e3 * sum(latencies) / len(latencies), 3)}
    sums: dict[str, list[float]] = {}
    for name in counters.threads:
        cpu_ns, wait_ns, slices = (a - b for a, b in zip(after[name], before[name], strict=True))
        figures.update(thread_figures(name, cpu_ns, wait_ns, slices, len(latencies)))
        sums[name] = [cpu_ns, wait_ns, slices, len(latencies)]
    return figures, sums


def thread_figures(
    name: str, cpu_ns: float, wait_ns: float, slices: float, appends: int
) -> dict[str, float | None]:
    """A thread's CPU, wait for a CPU (µs) and timeslices an append."""
    return {
        f"{name}_cpu_us_per_append": per(cpu_ns / 1e3, appends),
        f"{name}_wait_us_per_append": per(wait_ns / 1e3, appends),
        f"{name}_slices_per_append": per(slices, appends, 3),
    }


async def measure(base: Path, url: str, rounds: int, appends: int, hooks: int) -> dict[str, Any]:
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(base / "wal"))
    try:
        await webhooks_bench.ingest_mix(timeline, appends // 4, PRODUCERS)  # warm-up
        counters = Counters(thread_named("wal-writer"))
        pooled: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
        child_sums = [0.0, 0.0, 0.0]  # CPU ns, timeslices, deliveries
        per_round: list[dict[str, Any]] = []
        for number in range(rounds):
            order = MODES if number % 2 == 0 else MODES[::-1]
            figures: dict[str, Any] = {"order": list(order)}
            names = [webhooks_bench.webhook(f"r{number}-hook{n:02d}", url) for n in range(hooks)]
            delivery = DeliveryProcess(
                names, timeline, base / f"cursors-{number}", "uvloop", gather_s=FEED_GATHER_S
            )
            try:
                for mode in order:
                    if mode != "none" and delivery.pid is None:
                        await delivery.start()
                    if mode == "none" and delivery.pid is not None:
                        await delivery.aclose()
                    assert delivery.pid is not None or mode == "none"
                    child_before = schedstat(delivery.pid) if mode == "webhooks" else (0, 0, 0)
                    delivered_before = delivered(delivery) if mode == "webhooks" else 0
                    if mode == "stopped":
                        os.kill(delivery.pid, signal.SIGSTOP)  # type: ignore[arg-type]
                    try:
                        figures[mode], sums = await window(timeline, counters, appends)
                    finally:
                        if mode == "stopped":
                            os.kill(delivery.pid, signal.SIGCONT)  # type: ignore[arg-type]
                    if mode != "none":
                        await wait_remote_cursors(delivery, timeline.durable_seq, 600)
                    if mode == "webhooks":
                        child_after = schedstat(delivery.pid)  # type: ignore[arg-type]
                        made = delivered(delivery) - delivered_before
                        cpu_ns, _wait_ns, slices = (
                            a - b for a, b in zip(child_after, child_before, strict=True)
                        )
                        figures[mode]["child_cpu_us_per_delivery"] = per(cpu_ns / 1e3, made)
                        figures[mode]["child_slices_per_delivery"] = per(slices, made, 3)
                        for index, value in enumerate((cpu_ns, slices, made)):
                            child_sums[index] += value
                    for name, values in sums.items():
                        total = pooled[mode].setdefault(name, [0.0] * len(values))
                        for index, value in enumerate(values):
                            total[index] += value
            finally:
                await delivery.aclose()
            per_round.append(figures)
            log(f"round {number + 1}/{rounds}: {figures}")
    finally:
        await asyncio.to_thread(timeline.close)
    summary: dict[str, Any] = {}
    for mode, threads in pooled.items():
        summary[mode] = {}
        for name, (cpu_ns, wait_ns, slices, count) in threads.items():
            summary[mode].update(thread_figures(name, cpu_ns, wait_ns, slices, int(count)))
    cpu_ns, slices, made = child_sums
    summary["webhooks"]["child_cpu_us_per_delivery"] = per(cpu_ns / 1e3, int(made))
    summary["webhooks"]["child_slices_per_delivery"] = per(slices, int(made), 3)
    return {"pooled": summary, "rounds": per_round}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    log("wake cost")
    costs = await wake_cost(args.wake_seconds)
    log(f"wake cost: {costs}")
    webhooks_bench.RECEIVER[0] = "raw"
    receiver, url = await webhooks_bench.fast_receiver(idle=args.receiver_idle)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = await measure(Path(tmp), url, args.rounds, args.appends, args.webhooks)
    finally:
        await webhooks_bench.close_receiver(receiver)
    return {
        "benchmark": "webhook_wakeups",
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "workload": "ingest_mix",
        "mix_rate_per_s": webhooks_bench.MIX_RATE_PER_S[0],
        "appends_per_window": args.appends,
        "webhooks": args.webhooks,
        "receiver_idle": args.receiver_idle,
        "gather_s": FEED_GATHER_S,
        "wake_cost": costs,
        **result,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 300 appends")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--appends", type=int, default=1000, help="appends a window")
    parser.add_argument("--webhooks", type=int, default=10)
    parser.add_argument("--wake-seconds", type=float, default=2.0, help="each wake_cost probe")
    parser.add_argument(
        "--receiver-idle",
        action="store_true",
        help="the receiver at SCHED_IDLE (a diagnostic: a deployment's receiver is on another "
        "host, so its CPU never delays the server's threads there)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.appends, args.wake_seconds = 1, 300, 0.5
    return args


if __name__ == "__main__":
    arguments = parse_args()
    print(json.dumps(asyncio.run(main(arguments)), indent=2))
