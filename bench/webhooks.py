#!/usr/bin/env python3
"""Benchmark of webhook delivery (``whip/webhooks/``): throughput, and what it costs ingest.

Prints exactly one JSON document on stdout; progress goes to stderr. Everything runs as
in the server: appends on this process's event loop, a real timeline (WAL, fsync) in a
temporary directory, real dispatchers in the server's delivery process
(:mod:`whip.webhooks.delivery_process`: a child that follows the WAL itself), and a real
aiohttp receiver on 127.0.0.1 in another child process (its own CPU, as a real
receiver's) that answers 204 at once and checks nothing (the receiver's cost is not the
server's). ``--compare-thread`` adds, in the same rounds, the design before it: the
dispatchers on a thread of this process (:mod:`whip.webhooks.delivery_thread`) with their
HTTP attempts in :mod:`whip.webhooks.attempt_process`. ``--compare-unflushed`` adds the
delivery process with its cursor file written only at its close (mode ``unflushed``: what
the cursor file's writes, one ``fsync`` and rename a second, add to the appends' confirm
latency, told apart from the rest of delivery). ``--compare-stopped`` adds a
delivery process started as in ``webhooks`` and ``SIGSTOP``ped for its window (mode
``stopped``): the server's side alone (the fan-out's frames, the governor's sampling, a
child that exists), no delivery in the window. ``--compare-idle-receiver``
adds the delivery process posting to a second receiver kept at ``SCHED_IDLE`` (mode
``idle_receiver``): the receiver's own CPU, on the server's two cores here but on another
host in a deployment, told apart. ``--compare-warm`` adds the delivery
process measured only after ``--warm-appends`` appends delivered since its start (mode
``warm``): the child's first seconds told apart. ``--compare-nice`` adds the
delivery process kept at ``nice`` (mode ``nice``) against the default, whose governor puts
it at ``SCHED_IDLE`` while it keeps up (:mod:`whip.webhooks.child_priority`; each round's
``delivery_process_cpu`` entry says which it was and how often it starved).

Sections:

1. ``throughput``: a backlog of ``--backlog`` events in ``--runs`` runs is appended, then
   one webhook starts at cursor 0; the figure is events delivered per second until its
   cursor reaches the log's end (each run in order, ``max_parallel_runs`` runs at once).
2. ``confirm_latency``: ``--appends`` appends from ``--producers`` concurrent producers,
   each ``await timeline.append(...)`` timed, first with no webhook, then with
   ``--webhooks`` webhooks delivering live (and with them on the thread, given
   ``--compare-thread``), in the same run; then all once more in the opposite order
   (warm-up and drift show as a difference between the two rounds); ``--rounds`` such
   pairs. ``pooled`` is every round's samples of a mode together (the modes alternate,
   so the host's drift falls on all of them alike): the figure to read.
   ``mean_of_rounds`` is each added percentage's mean over the rounds with its 95 %
   confidence interval (Student's t, a round one sample): how far the rounds' spread
   lets a figure be told from a bound such as issue 14's 5 %.
   Percentiles in milliseconds, and the added latency in percent. Each mode's
   ``fsync_mean_ms`` is the WAL's mean ``fdatasync`` per group commit in its windows
   (``Timeline.sync_latency``); ``pooled`` also gives the added mean in milliseconds and
   the added ``fdatasync`` mean beside it (``added_mean_ms_*``, ``added_fsync_mean_ms_*``):
   how much of what webhooks add is the disk, the rest being CPU. Each mode also gets
   ``server_us_per_append``, this process's CPU (every thread: the loop, the WAL writer,
   the producers, the server's side of the webhooks; not the delivery process's nor the
   receiver's) an append in its windows, and each round ``added_server_cpu_percent_*``:
   what webhooks cost the server in CPU rather than latency. Three workloads:
   ``ingest_mix`` (a steady ``--mix-rate`` appends/s, default 100, mostly ``stats``,
   every 10th a lifecycle type: what a server's timeline sees), ``every_event_paced``
   (a steady ``--paced-rate`` appends/s, default 150, every event wanted by every webhook:
   1,500 deliveries a second for the whole window, the delivery process busy throughout)
   and ``every_event_wanted`` (back to back, every event wanted: a burst; its window is
   about 0.1 s, while its 20,000 deliveries take seconds, so it measures the first tenth
   of a second of a delivery burst, child warm-up included).
3. ``confirm_latency_interleaved`` (``--interleaved-pairs N``, per workload): the same
   question in short alternating windows of ``--window-appends`` appends, one delivery
   process alive throughout and stopped in the ``none`` windows
   (:mod:`bench.support.interleaved_webhooks`): the host's drift between windows falls
   on both sides alike, and no window holds a child's start.

Usage::

    .venv/bin/python bench/webhooks.py            # about two minutes
    .venv/bin/python bench/webhooks.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] != str(REPO):
    sys.path.insert(0, str(REPO))  # `python bench/webhooks.py` puts bench/ first (bench/whip.py)

from aiohttp import web  # noqa: E402

from bench.support.interleaved_webhooks import (  # noqa: E402
    Window,
    delivered,
    interleaved_cost,
    measured,
    pooled_window,
    process_cpu_s,
    stopped_if,
    us_per_delivery,
    wait_remote_cursors,
    window_figures,
)
from bench.support.latency import (  # noqa: E402
    added_percent,
    disk_share,
    mean_interval,
)
from bench.support.saturated_delivery import saturated  # noqa: E402
from registry.events import NewEvent  # noqa: E402
from registry.timeline import Timeline, TimelineConfig  # noqa: E402
from whip.webhooks.attempt_process import AttemptProcess  # noqa: E402
from whip.webhooks.config import WebhookConfig  # noqa: E402
from whip.webhooks.cursor import FLUSH_INTERVAL_S, CursorState, FileCursorStore  # noqa: E402
from whip.webhooks.delivery_process import DeliveryProcess  # noqa: E402
from whip.webhooks.delivery_thread import DeliveryThread  # noqa: E402
from whip.webhooks.dispatcher import WebhookDispatcher  # noqa: E402
from whip.webhooks.group import FEED_GATHER_S, WebhookGroup  # noqa: E402

SECRET = os.urandom(32)


def log(message: str) -> None:
    print(f"[webhooks {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class RawReceiver(asyncio.Protocol):
    """``--receiver raw``: each request read to the end of its ``Content-Length`` body and
    answered 204 on the same connection, nothing else (what a receiver written in a
    compiled language costs, about what the server's host would never see)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(self.buffer[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                break
            del self.buffer[: end + 4 + length]
            answers += 1
        if answers and self.transport is not None:
            self.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n" * answers)


async def serve_raw_receiver() -> None:
    """``--receiver raw`` in the child process (as :func:`serve_receiver`)."""
    server = await asyncio.get_running_loop().create_server(RawReceiver, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.to_thread(sys.stdin.read)
    server.close()


async def serve_receiver() -> None:
    """The child process: answer 204 to every POST on 127.0.0.1; print the port; run
    until stdin closes (the parent exits or closes it)."""

    if RECEIVER_NICE[0]:
        os.nice(RECEIVER_NICE[0])
    if RECEIVER_IDLE[0]:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if RECEIVER[0] == "raw":
        await serve_raw_receiver()
        return

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    print(server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
    await asyncio.to_thread(sys.stdin.read)
    await runner.cleanup()


async def fast_receiver(idle: bool = False) -> tuple[asyncio.subprocess.Process, str]:
    """The receiver child process (its own CPU, as a real receiver would be) and its URL
    (``idle``: at ``SCHED_IDLE``, for ``--compare-idle-receiver``)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve-receiver",
        f"--receiver-nice={RECEIVER_NICE[0]}",
        f"--receiver={RECEIVER[0]}",
        *(["--receiver-idle"] if idle else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    off_server_core(child.pid)
    port = int((await asyncio.wait_for(child.stdout.readline(), 30)).decode())
    return child, f"http://127.0.0.1:{port}/hook"


async def close_receiver(child: asyncio.subprocess.Process) -> None:
    """Close :func:`fast_receiver`'s child (it exits when its stdin closes; bounded)."""
    assert child.stdin is not None
    child.stdin.close()
    await asyncio.wait_for(child.wait(), 30)


def webhook(name: str, url: str) -> WebhookConfig:
    return WebhookConfig(
        name=name,
        url=url,
        secret_key=SECRET,
        events=("run_created", "stream_warning"),
        retry_min_s=0.05,
        retry_max_s=0.5,
    )


async def wait_cursor(dispatcher: WebhookDispatcher, seq: int, within_s: float) -> None:
    """Until the dispatcher's cursor reaches ``seq`` (bounded; polls its own state)."""
    deadline = time.monotonic() + within_s
    while dispatcher.ledger is None or dispatcher.ledger.upto < seq:
        if time.monotonic() > deadline:
            raise RuntimeError(f"cursor not at {seq} within {within_s} s: {dispatcher.status()}")
        await asyncio.sleep(0.005)


async def thread_throughput(
    timeline: Timeline, base: Path, url: str, last_seq: int
) -> dict[str, Any]:
    """``--compare-thread``: the same backlog delivered by the design before (a dispatcher
    on a delivery thread of this process, attempts in the attempt child), in the same run:
    events/s from the group's start to its cursor at the log's end."""
    cursors = base / "throughput" / "thread-webhooks"
    store = FileCursorStore(cursors)
    await store.save("fast-thread", CursorState(0))
    dispatcher = WebhookDispatcher(webhook("fast-thread", url), timeline, store)
    started = time.perf_counter()
    async with on_delivery_thread([dispatcher], timeline):
        await wait_cursor(dispatcher, last_seq, 600)
        elapsed = time.perf_counter() - started
    return {"thread_events_per_s": round(last_seq / elapsed, 1)}


@contextlib.asynccontextmanager
async def on_delivery_thread(
    dispatchers: list[WebhookDispatcher], timeline: Timeline
) -> AsyncIterator[None]:
    """The design before the delivery process, running: ``dispatchers`` in a group on a
    delivery thread of this process, their attempts in the attempt child; closed on exit."""
    group = WebhookGroup(dispatchers, timeline, attempts=AttemptProcess("uvloop"))
    thread = DeliveryThread("uvloop")
    await thread.start()
    try:
        await thread.run(group.start())
        yield
        await thread.run(group.aclose())
    finally:
        await thread.stop()


async def throughput(
    base: Path, url: str, backlog: int, runs: int, compare: bool = False
) -> dict[str, Any]:
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(base / "throughput"))
    try:
        appends = [
            timeline.append(NewEvent(f"run{i % runs:04d}", "stream_warning", "bench", {"n": i}))
            for i in range(backlog)
        ]
        seqs = await asyncio.gather(*appends)
        cursors = base / "throughput" / "webhooks"
        await FileCursorStore(cursors).save("fast", CursorState(0))
        fast = webhook("fast", url)
        delivery = DeliveryProcess([fast], timeline, cursors, "uvloop", gather_s=FEED_GATHER_S)
        started = time.perf_counter()
        await delivery.start()
        ready = time.perf_counter()
        await wait_remote_cursors(delivery, max(seqs), 600)
        done = time.perf_counter()
        await delivery.aclose()
        thread_figures = await thread_throughput(timeline, base, url, max(seqs)) if compare else {}
    finally:
        await asyncio.to_thread(timeline.close)
    return {
        **thread_figures,
        "events": backlog,
        "runs": runs,
        "max_parallel_runs": fast.max_parallel_runs,
        "seconds": round(done - started, 3),
        "events_per_s": round(backlog / (done - started), 1),
        "includes": "the delivery process's start (its index of the log)",
        "start_seconds": round(ready - started, 3),
        "events_per_s_after_start": round(backlog / (done - ready), 1),
    }


async def closed_loop(timeline: Timeline, appends: int, producers: int) -> list[float]:
    """Every event wanted by every webhook, producers appending back to back."""
    latencies: list[float] = []
    per_producer = appends // producers

    async def producer(p: int) -> None:
        for i in range(per_producer):
            event = NewEvent(f"live{p:03d}", "stream_warning", "bench", {"n": i})
            t0 = time.perf_counter()
            await timeline.append(event)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(producer(p) for p in range(producers)))
    return latencies


async def paced(
    timeline: Timeline, appends: int, producers: int, rate_per_s: float, wanted_every: int
) -> list[float]:
    """Each producer (a session) appends at a steady rate, ``rate_per_s`` in all; every
    ``wanted_every``-th event a type the webhooks want, the others ``stats`` (not a default
    webhook type)."""
    latencies: list[float] = []
    per_producer = appends // producers
    interval = producers / rate_per_s

    async def producer(p: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time() + interval * p / producers
        for i in range(per_producer):
            delay = start + i * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            etype = "stream_warning" if i % wanted_every == 0 else "stats"
            event = NewEvent(f"mix{p:03d}", etype, "bench", {"n": i})
            t0 = time.perf_counter()
            await timeline.append(event)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(producer(p) for p in range(producers)))
    return latencies


async def ingest_mix(timeline: Timeline, appends: int, producers: int) -> list[float]:
    """What a server's timeline sees: ``MIX_RATE_PER_S`` appends per second, mostly
    ``stats``, every 10th a lifecycle type."""
    return await paced(timeline, appends, producers, MIX_RATE_PER_S[0], 10)


async def every_event_paced(timeline: Timeline, appends: int, producers: int) -> list[float]:
    """Sustained delivery load: ``PACED_RATE_PER_S`` appends per second, every one wanted
    by every webhook, so the delivery process is busy for the whole window (the closed
    loop's window is about 0.1 s, and most of its deliveries come after it)."""
    return await paced(timeline, appends, producers, PACED_RATE_PER_S[0], 1)


MIX_RATE_PER_S = [100.0]
"""Appends per second of ``ingest_mix`` (``--mix-rate``): about what 100 live sessions
append (two tracks' ``stats`` every 5 s each, their lifecycle events, some analyzers)."""
PACED_RATE_PER_S = [150.0]
"""Appends per second of ``every_event_paced`` (``--paced-rate``): with 10 webhooks, 1,500
deliveries a second, about half of what the delivery process manages flat out here."""
WORKLOADS = {
    "ingest_mix": ingest_mix,
    "every_event_paced": every_event_paced,
    "every_event_wanted": closed_loop,
}
SPLIT_CORES = [False]
"""``--split-cores``: this process (the server: its loop and the WAL writer) on the first
core, the delivery process and the receiver on the others. A diagnostic: what the
webhooks cost the server when their CPU is not taken from the server's cores."""


def off_server_core(pid: int) -> None:
    """With ``--split-cores``, move ``pid`` off the server's core."""
    if SPLIT_CORES[0]:
        os.sched_setaffinity(pid, set(range(1, os.cpu_count() or 2)))


RECEIVER = ["aiohttp"]
"""``--receiver``: ``aiohttp`` (an aiohttp server, a Python receiver's cost) or ``raw``
(:class:`RawReceiver`: a receiver that costs little, as one in a compiled language)."""
RECEIVER_IDLE = [False]
"""In the receiver child: run at ``SCHED_IDLE`` (``--compare-idle-receiver``'s second one)."""
RECEIVER_NICE = [0]
"""``--receiver-nice``: the receiver's CPU priority below the server's (a real receiver
runs on another host; on a 2-core bench host it competes with the server for the cores)."""


async def round_with_process(
    timeline: Timeline,
    base: Path,
    url: str,
    count: int,
    load: Any,
    appends: int,
    producers: int,
    *,
    sched_idle: bool = True,
    cursor_flush_s: float = FLUSH_INTERVAL_S,
    warmup_appends: int = 0,
    stopped: bool = False,
) -> Window:
    """One measured window with ``count`` webhooks in the delivery process (``sched_idle``
    false: kept at ``nice``, whatever its governor would do; ``cursor_flush_s``: the
    cursor file's group-commit window; ``warmup_appends``: appended and delivered after
    the child's start, before the measured window; ``stopped``: the child ``SIGSTOP``ped
    for the window and caught up after it, so the window has only the server's side)."""
    round_id = next(ROUND_IDS)
    hooks = [webhook(f"r{round_id}-hook{n:02d}", url) for n in range(count)]
    delivery = DeliveryProcess(
        hooks,
        timeline,
        base,
        "uvloop",
        gather_s=GATHER_S[0],
        sched_idle=sched_idle,
        cursor_flush_s=cursor_flush_s,
    )
    await delivery.start()
    assert delivery.pid is not None
    off_server_core(delivery.pid)
    try:
        if warmup_appends:
            await load(timeline, warmup_appends, producers)
            await wait_remote_cursors(delivery, timeline.durable_seq, 600)
        cpu_before = process_cpu_s(delivery.pid)
        with stopped_if(delivery.pid, stopped):
            window = await measured(timeline, load, appends, producers)
        await wait_remote_cursors(delivery, timeline.durable_seq, 600)
        cpu = process_cpu_s(delivery.pid) - cpu_before
        successes = delivered(delivery)
        CHILD_CPU.append(
            {
                "cpu_s": round(cpu, 3),
                "deliveries": successes,
                "sched_idle": sched_idle,
                "cursor_flush_s": cursor_flush_s,
                "stopped_in_window": stopped,
                "starvations": delivery.governor.starvations,
            }
        )
    finally:
        await delivery.aclose()
    return window


WARM_APPENDS = [500]
"""``--compare-warm``: appends delivered after the child's start before its window
(``--warm-appends``)."""

GATHER_S = [FEED_GATHER_S]
"""``--gather-s``: how long the server's fan-out gathers durable batches before it tells the
delivery process (the server's default; longer: fewer, larger wake-ups of the child)."""

UNFLUSHED_S = 1e6
"""``--compare-unflushed``: a group-commit window longer than any round, so the delivery
process writes its cursor file only at its close (after the measured window)."""

ROUND_IDS = itertools.count()
"""Names the webhooks of each round anew: new webhooks start at the log's end, so a round
delivers the events of its own window only (with the same names it would first deliver
what the other modes' rounds appended meanwhile, a backlog in the measured window)."""

CHILD_CPU: list[dict[str, Any]] = []
"""Per process round: the delivery process's CPU from its ready frame to its last
cursor (it indexes the log before), and the deliveries it made meanwhile."""


async def round_with_thread(
    timeline: Timeline, base: Path, url: str, count: int, load: Any, appends: int, producers: int
) -> Window:
    """One measured window with ``count`` webhooks on a delivery thread of this process,
    their attempts in the attempt child (the design before the delivery process)."""
    store = FileCursorStore(base)
    round_id = next(ROUND_IDS)
    dispatchers = [
        WebhookDispatcher(webhook(f"r{round_id}-thread{n:02d}", url), timeline, store)
        for n in range(count)
    ]
    async with on_delivery_thread(dispatchers, timeline):
        window = await measured(timeline, load, appends, producers)
        for d in dispatchers:
            await wait_cursor(d, timeline.durable_seq, 600)
    return window


def added(figures: dict[str, Any], mode: str, stat: str) -> float:
    return added_percent(float(figures["none"][stat]), float(figures[mode][stat]))


async def confirm_latency(
    base: Path, url: str, args: argparse.Namespace, workload: str, idle_url: str | None = None
) -> dict[str, Any]:
    """The round method (module doc, section 2); ``idle_url``: the ``SCHED_IDLE`` receiver
    of mode ``idle_receiver``."""
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(base / workload))
    cursors = base / workload / "webhooks"
    load = WORKLOADS[workload]
    appends, producers, webhooks = args.appends, args.producers, args.webhooks
    modes = (
        ["none", "webhooks"]
        + (["nice"] if args.compare_nice else [])
        + (["unflushed"] if args.compare_unflushed else [])
        + (["warm"] if args.compare_warm else [])
        + (["stopped"] if args.compare_stopped else [])
        + (["idle_receiver"] if idle_url is not None else [])
        + (["thread"] if args.compare_thread else [])
    )
    rounds: list[dict[str, Any]] = []
    windows: dict[str, list[Window]] = {mode: [] for mode in modes}
    try:
        await load(timeline, appends // 4, producers)  # warm-up
        for number in range(args.rounds * 2):
            order = modes if number % 2 == 0 else modes[::-1]
            figures: dict[str, Any] = {}
            for mode in order:
                if mode == "none":
                    if args.warmup_appends:
                        await load(timeline, args.warmup_appends, producers)
                    window = await measured(timeline, load, appends, producers)
                elif mode in ("webhooks", "nice", "unflushed", "warm", "stopped", "idle_receiver"):
                    window = await round_with_process(
                        timeline,
                        cursors / "process",
                        idle_url if mode == "idle_receiver" and idle_url else url,
                        webhooks,
                        load,
                        appends,
                        producers,
                        sched_idle=mode != "nice",
                        cursor_flush_s=UNFLUSHED_S if mode == "unflushed" else FLUSH_INTERVAL_S,
                        warmup_appends=WARM_APPENDS[0] if mode == "warm" else args.warmup_appends,
                        stopped=mode == "stopped",
                    )
                else:
                    window = await round_with_thread(
                        timeline, cursors / "thread", url, webhooks, load, appends, producers
                    )
                figures[mode] = window_figures(window)
                windows[mode].append(window)
            for mode in modes[1:]:
                figures[f"added_p50_percent_{mode}"] = added(figures, mode, "p50_ms")
                figures[f"added_p90_percent_{mode}"] = added(figures, mode, "p90_ms")
                figures[f"added_p99_percent_{mode}"] = added(figures, mode, "p99_ms")
                figures[f"added_mean_percent_{mode}"] = added(figures, mode, "mean_ms")
                figures[f"added_server_cpu_percent_{mode}"] = added(
                    figures, mode, "server_us_per_append"
                )
            rounds.append({"order": list(order), **figures})
            log(f"{workload} round {order}: {figures}")
    finally:
        await asyncio.to_thread(timeline.close)
    added_keys = [key for key in rounds[0] if key.startswith("added_")]
    summary = {key: statistics.median(r[key] for r in rounds) for key in added_keys}
    intervals = {key: mean_interval([r[key] for r in rounds]) for key in added_keys}
    every: dict[str, Any] = {
        mode: window_figures(pooled_window(each)) for mode, each in windows.items()
    }
    cpu = sum(r["cpu_s"] for r in CHILD_CPU)
    deliveries = sum(r["deliveries"] for r in CHILD_CPU)
    every["delivery_process_cpu"] = {
        "rounds": list(CHILD_CPU),
        "us_per_delivery": us_per_delivery(cpu, deliveries),
    }
    CHILD_CPU.clear()
    for mode in modes[1:]:
        for stat in ("p50_ms", "p90_ms", "p99_ms", "mean_ms"):
            every[f"added_{stat.removesuffix('_ms')}_percent_{mode}"] = added(every, mode, stat)
        every[f"added_server_cpu_percent_{mode}"] = added(every, mode, "server_us_per_append")
        for key, value in disk_share(every["none"], every[mode]).items():
            every[f"{key}_{mode}"] = value
    return {
        "appends": appends,
        "producers": producers,
        "webhooks": webhooks,
        "pooled": every,
        "median_of_rounds": summary,
        "mean_of_rounds": intervals,
        "rounds": rounds,
    }


async def confirm_latency_interleaved(
    base: Path, url: str, args: argparse.Namespace, workload: str
) -> dict[str, Any]:
    """``--interleaved-pairs``: :mod:`bench.support.interleaved_webhooks` on a timeline of
    its own, one delivery process with ``--webhooks`` webhooks for every window."""
    directory = base / f"{workload}-interleaved"
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(directory))
    try:
        hooks = [webhook(f"interleaved-hook{n:02d}", url) for n in range(args.webhooks)]
        delivery = DeliveryProcess(
            hooks, timeline, directory / "webhooks", "uvloop", gather_s=GATHER_S[0]
        )
        await delivery.start()
        try:
            assert delivery.pid is not None
            off_server_core(delivery.pid)
            return await interleaved_cost(
                timeline,
                delivery,
                WORKLOADS[workload],
                pairs=args.interleaved_pairs,
                window_appends=args.window_appends,
                producers=args.producers,
                log=log,
            )
        finally:
            await delivery.aclose()
    finally:
        await asyncio.to_thread(timeline.close)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    if SPLIT_CORES[0]:
        os.sched_setaffinity(0, {0})  # before the timeline starts its writer thread
    child, url = await fast_receiver()
    receivers = [child]
    idle_url = None
    if args.compare_idle_receiver:
        idle_child, idle_url = await fast_receiver(idle=True)
        receivers.append(idle_child)
    try:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            base = Path(tmp)
            log(f"throughput: {args.backlog} events in {args.runs} runs")
            result_throughput = await throughput(
                base, url, args.backlog, args.runs, args.compare_thread
            )
            log(f"throughput: {result_throughput}")
            latency = {  # --rounds 0: the throughput only
                workload: await confirm_latency(base, url, args, workload, idle_url)
                for workload in (args.workloads if args.rounds > 0 else [])
            }
            interleaved = {
                workload: await confirm_latency_interleaved(base, url, args, workload)
                for workload in (args.workloads if args.interleaved_pairs > 0 else [])
            }
            busy_host = None
            if args.saturated > 0:
                log(f"saturated host: {args.saturated} s a mode")
                busy_host = await saturated(base, url, webhook, args.saturated)
                log(f"saturated host: {busy_host}")
    finally:
        for receiver in receivers:
            await close_receiver(receiver)
    return {
        "benchmark": "webhooks",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "throughput": result_throughput,
        "confirm_latency": latency,
        "confirm_latency_interleaved": interleaved,
        "saturated_host": busy_host,
        "ingest_mix_rate_per_s": MIX_RATE_PER_S[0],
        "every_event_paced_rate_per_s": PACED_RATE_PER_S[0],
        "receiver": RECEIVER[0],
        "receiver_nice": RECEIVER_NICE[0],
        "gather_s": GATHER_S[0],
        "split_cores": SPLIT_CORES[0],
        "delivery": "process"
        + (", kept at nice (compared)" if args.compare_nice else "")
        + (", cursor file unflushed (compared)" if args.compare_unflushed else "")
        + (", warm child (compared)" if args.compare_warm else "")
        + (", child stopped in its window (compared)" if args.compare_stopped else "")
        + (", receiver at SCHED_IDLE (compared)" if args.compare_idle_receiver else "")
        + (" and thread (compared)" if args.compare_thread else ""),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small figures, a few seconds")
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--appends", type=int, default=2_000)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--webhooks", type=int, default=10)
    parser.add_argument(
        "--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS)
    )
    parser.add_argument("--dir", default=None, help="base directory (default: the system's)")
    parser.add_argument("--mix-rate", type=float, default=100.0, help="ingest_mix appends/s")
    parser.add_argument(
        "--paced-rate", type=float, default=150.0, help="every_event_paced appends/s"
    )
    parser.add_argument("--rounds", type=int, default=1, help="pairs of rounds (both orders)")
    parser.add_argument(
        "--interleaved-pairs",
        type=int,
        default=0,
        help="also per workload this many pairs of short alternating windows, one delivery "
        "process stopped in the `none` ones (bench/support/interleaved_webhooks.py); 0: skip",
    )
    parser.add_argument(
        "--warmup-appends",
        type=int,
        default=0,
        help="before each measured round, this many appends not measured (in the process "
        "modes after the child's start, delivered before the window): steady state only",
    )
    parser.add_argument(
        "--compare-warm",
        action="store_true",
        help="also the delivery process measured after --warm-appends appends delivered "
        "since its start (mode `warm`): what of the webhooks' cost is the child's first seconds",
    )
    parser.add_argument(
        "--warm-appends",
        type=int,
        default=500,
        help="appends the `warm` mode's child delivers before its window (at the workload's "
        "rate: 500 are 5 s of ingest_mix)",
    )
    parser.add_argument(
        "--compare-stopped",
        action="store_true",
        help="also a delivery process started as in `webhooks` and SIGSTOPped for the "
        "window (mode `stopped`): what the server's side alone costs (the fan-out's "
        "frames, the governor's sampling), with no delivery in the window",
    )
    parser.add_argument(
        "--compare-idle-receiver",
        action="store_true",
        help="also the delivery process posting to a second receiver at SCHED_IDLE (mode "
        "`idle_receiver`): what the receiver's own CPU on the server's cores, which a real "
        "receiver on another host never takes, adds to `webhooks`",
    )
    parser.add_argument("--receiver-idle", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--gather-s",
        type=float,
        default=FEED_GATHER_S,
        help="the fan-out's gather window of the measured delivery processes (default: the "
        "server's)",
    )
    parser.add_argument(
        "--window-appends", type=int, default=500, help="appends in an interleaved window"
    )
    parser.add_argument(
        "--compare-thread",
        action="store_true",
        help="also the dispatchers on a thread of this process (the design before)",
    )
    parser.add_argument(
        "--saturated",
        type=float,
        default=0.0,
        help="also S seconds a mode of deliveries with every core busy "
        "(bench/support/saturated_delivery.py); 0: skip",
    )
    parser.add_argument(
        "--compare-nice",
        action="store_true",
        help="also the delivery process kept at nice (mode `nice`), not SCHED_IDLE",
    )
    parser.add_argument(
        "--compare-unflushed",
        action="store_true",
        help="also the delivery process with its cursor file written only at its close "
        "(mode `unflushed`): the cursor file's share of what webhooks cost the appends",
    )
    parser.add_argument(
        "--receiver-nice",
        type=int,
        default=0,
        help="run the receiver this much nicer than the server (0: the same priority)",
    )
    parser.add_argument(
        "--receiver",
        choices=("aiohttp", "raw"),
        default="aiohttp",
        help="the receiver: an aiohttp server, or a bare protocol answering 204 (cheaper)",
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="diagnostic: this process on core 0, the delivery process and receiver elsewhere",
    )
    parser.add_argument("--serve-receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.backlog, args.runs, args.appends = 2_000, 20, 400
        args.interleaved_pairs = min(args.interleaved_pairs, 2)
        args.window_appends = min(args.window_appends, 200)
    return args


if __name__ == "__main__":
    arguments = parse_args()
    MIX_RATE_PER_S[0] = arguments.mix_rate
    GATHER_S[0] = arguments.gather_s
    WARM_APPENDS[0] = arguments.warm_appends
    PACED_RATE_PER_S[0] = arguments.paced_rate
    RECEIVER_NICE[0] = arguments.receiver_nice
    RECEIVER_IDLE[0] = arguments.receiver_idle
    RECEIVER[0] = arguments.receiver
    SPLIT_CORES[0] = arguments.split_cores
    if arguments.serve_receiver:
        asyncio.run(serve_receiver())
    else:
        print(json.dumps(asyncio.run(main(arguments)), indent=2))
