"""What webhooks cost the appends, in short alternating windows with one delivery process
alive throughout (``bench/webhooks.py --interleaved-pairs``).

Why: ``bench/webhooks.py``'s rounds start a delivery process for each ``webhooks`` round
and measure 20 s windows one after another. A round's added mean moved by 13-18 points
while within a window the mean is known to about 1 %, so what moves is the host between
windows tens of seconds apart (and each round's child start falls into its window). The
decode bench met the same noise and answered it with short interleaved segments
(:mod:`bench.support.interleaved_decode`); this is that method for the webhooks.

Method:

- One :class:`~whip.webhooks.delivery_process.DeliveryProcess` (the caller's, started)
  serves every window, so no window holds a child's start.
- Windows of ``window_appends`` appends (the workload's own pacing) alternate: in a
  ``webhooks`` window the child follows the log and delivers as in the server; in a
  ``none`` window it is stopped (``SIGSTOP``: no CPU, no I/O). The order is reversed every
  pair, so drift falls on both sides alike.
- After every window the child is continued (``SIGCONT``) and the bench waits until every
  cursor is at the log's end before the next window starts: a ``webhooks`` window
  measures deliveries keeping up with the appends, never a backlog left by the window
  before.
- What ``none`` still has: the server's side of the webhooks, its one ``durable`` frame
  written into the child's pipe per gathered wake-up (about 20 small writes a second at
  100 appends/s; the pipe holds them while the child is stopped). The figure is low by
  that share, a few microseconds of the loop's time a second.
- Per window: the confirm-latency percentiles, the WAL's mean ``fdatasync`` per group
  commit (``Timeline.sync_latency``) and this process's CPU an append
  (``server_us_per_append``, :class:`Window`). Per side: the child's CPU a delivery, its window
  and catch-up together (``child_us_per_delivery``: in ``webhooks`` delivered live, in
  ``none`` as a backlog after the window). Per pair: the added percentages of its ``webhooks``
  window over its ``none`` window. Output: every window's samples pooled per side, the
  added figures of the pooled samples, and the pairs' mean added figures with a 95 %
  interval (a pair one sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from bench.support.latency import (
    added_percent,
    disk_share,
    fsync_mean_ms,
    mean_interval,
    percentiles_ms,
)
from registry.timeline import Timeline
from whip.webhooks.delivery_process import DeliveryProcess

Load = Callable[[Timeline, int, int], Awaitable[list[float]]]
"""``load(timeline, appends, producers)``: the appends' confirm latencies in seconds."""

SIDES = ("none", "webhooks")


class Window(NamedTuple):
    """A measured window."""

    latencies: list[float]
    """The appends' confirm latencies (seconds)."""
    sync_s: float
    """The WAL's ``fdatasync`` seconds in the window ..."""
    syncs: int
    """... and how many."""
    server_cpu_s: float
    """This process's CPU seconds in the window (every thread: the loop, the WAL writer,
    the load's producers, the server's side of the webhooks), the delivery process and
    the receiver not included: what the server spent on its appends."""


async def measured(timeline: Timeline, load: Load, appends: int, producers: int) -> Window:
    """``load`` run once as a measured :class:`Window`."""
    synced_before = timeline.sync_latency.read()
    cpu_before = time.process_time()
    latencies = await load(timeline, appends, producers)
    cpu = time.process_time() - cpu_before
    synced = timeline.sync_latency.read()
    return Window(
        latencies, synced.total - synced_before.total, synced.count - synced_before.count, cpu
    )


def server_us_per_append(cpu_s: float, appends: int) -> float | None:
    """The server's CPU microseconds an append (None without appends)."""
    return round(1e6 * cpu_s / appends, 1) if appends else None


def window_figures(window: Window) -> dict[str, Any]:
    """A window's confirm-latency percentiles, mean ``fdatasync`` and server CPU an append."""
    return {
        **percentiles_ms(window.latencies),
        "fsync_mean_ms": fsync_mean_ms(window.sync_s, window.syncs),
        "server_us_per_append": server_us_per_append(window.server_cpu_s, len(window.latencies)),
    }


def pooled_window(windows: list[Window]) -> Window:
    """Several windows as one: their samples together and their sums added."""
    return Window(
        [latency for window in windows for latency in window.latencies],
        sum(window.sync_s for window in windows),
        sum(window.syncs for window in windows),
        sum(window.server_cpu_s for window in windows),
    )


@contextlib.contextmanager
def stopped_if(pid: int, stop: bool) -> Iterator[None]:
    """``pid`` ``SIGSTOP``ped for the block when ``stop``, and continued after it whatever
    happened in it."""
    if stop:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if stop:
            os.kill(pid, signal.SIGCONT)


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def us_per_delivery(cpu_s: float, deliveries: int) -> float | None:
    """The child's CPU microseconds a delivery (None when it made none)."""
    return round(1e6 * cpu_s / deliveries, 1) if deliveries else None


def delivered(delivery: DeliveryProcess) -> int:
    """Successful deliveries of every webhook of ``delivery`` (as last pushed)."""
    return sum(remote.outcomes["success"] for remote in delivery.webhooks)


async def wait_remote_cursors(delivery: DeliveryProcess, seq: int, within_s: float) -> None:
    """Until every webhook of the delivery process has its cursor at ``seq`` (bounded;
    asks the child, so only between measured windows)."""
    deadline = time.monotonic() + within_s
    while True:
        await delivery.refresh()
        items = delivery.items()
        cursors = [items.get(w.name, {}).get("cursor", 0) for w in delivery.webhooks]
        if all(isinstance(c, int) and c >= seq for c in cursors):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"cursors not at {seq} within {within_s} s: {cursors}")
        await asyncio.sleep(0.005)


async def _window(
    timeline: Timeline,
    delivery: DeliveryProcess,
    load: Load,
    side: str,
    appends: int,
    producers: int,
) -> tuple[Window, float, int]:
    """One window of ``side``, the child caught up after it; with the child's CPU seconds
    and deliveries from the window's start to its catch-up's end."""
    pid = delivery.pid
    assert pid is not None
    cpu_before, delivered_before = process_cpu_s(pid), delivered(delivery)
    with stopped_if(pid, side == "none"):
        window = await measured(timeline, load, appends, producers)
    await wait_remote_cursors(delivery, timeline.durable_seq, 600)
    return window, process_cpu_s(pid) - cpu_before, delivered(delivery) - delivered_before


async def interleaved_cost(
    timeline: Timeline,
    delivery: DeliveryProcess,
    load: Load,
    *,
    pairs: int,
    window_appends: int,
    producers: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """``pairs`` pairs of windows (module doc); ``delivery`` started on ``timeline``."""
    await load(timeline, window_appends, producers)  # warm-up: the child delivers once
    await wait_remote_cursors(delivery, timeline.durable_seq, 600)
    windows: dict[str, list[Window]] = {side: [] for side in SIDES}
    child: dict[str, list[float]] = {side: [0.0, 0] for side in SIDES}
    """Per side: the child's CPU seconds and deliveries, each window with its catch-up."""
    per_pair: list[dict[str, Any]] = []
    for number in range(pairs):
        order = SIDES if number % 2 == 0 else SIDES[::-1]
        figures: dict[str, Any] = {"order": list(order)}
        for side in order:
            window, cpu_s, deliveries = await _window(
                timeline, delivery, load, side, window_appends, producers
            )
            child[side][0] += cpu_s
            child[side][1] += deliveries
            figures[side] = window_figures(window)
            windows[side].append(window)
        for stat in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "server_us_per_append"):
            figures[f"added_{stat.removesuffix('_ms')}_percent"] = added_percent(
                figures["none"][stat], figures["webhooks"][stat]
            )
        per_pair.append(figures)
        log(f"interleaved pair {number + 1}/{pairs} {order}: {figures}")
    every: dict[str, Any] = {}
    for side in SIDES:
        cpu_s, deliveries = child[side]
        every[side] = {
            **window_figures(pooled_window(windows[side])),
            "child_us_per_delivery": us_per_delivery(cpu_s, int(deliveries)),
        }
    for stat in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "server_us_per_append"):
        every[f"added_{stat.removesuffix('_ms')}_percent"] = added_percent(
            every["none"][stat], every["webhooks"][stat]
        )
    every.update(disk_share(every["none"], every["webhooks"]))
    added_keys = [key for key in per_pair[0] if key.startswith("added_")] if per_pair else []
    return {
        "pairs": pairs,
        "window_appends": window_appends,
        "producers": producers,
        "pooled": every,
        "mean_of_pairs": {key: mean_interval([p[key] for p in per_pair]) for key in added_keys},
        "per_pair": per_pair,
    }
