#!/usr/bin/env python3
"""Benchmark of webhook delivery (``whip/webhooks/``): throughput, and what it costs ingest.

Prints exactly one JSON document on stdout; progress goes to stderr. Everything runs in
this process as in the server: appends on the main event loop, the webhooks on their
delivery thread's loop (:mod:`whip.webhooks.delivery_thread`), a real timeline (WAL,
fsync) in a temporary directory, real dispatchers, and a real aiohttp receiver on 127.0.0.1 in a
child process (its own CPU, as a real receiver's) that answers 204 at once and checks
nothing (the receiver's cost is not the server's).

Sections:

1. ``throughput``: a backlog of ``--backlog`` events in ``--runs`` runs is appended, then
   one webhook starts at cursor 0; the figure is events delivered per second until its
   cursor reaches the log's end (each run in order, ``max_parallel_runs`` runs at once).
2. ``confirm_latency``: ``--appends`` appends from ``--producers`` concurrent producers,
   each ``await timeline.append(...)`` timed, first with no webhook, then with
   ``--webhooks`` webhooks delivering live, in the same run; then both once more in the
   opposite order (warm-up and drift show as a difference between the two rounds).
   Percentiles in milliseconds, and the added latency in percent. Two workloads:
   ``ingest_mix`` (a steady ``--mix-rate`` appends/s, default 100, mostly ``stats``,
   every 10th a lifecycle type: what a server's timeline sees) and ``every_event_wanted`` (back to
   back, every event wanted by every webhook: the worst case, where the webhooks'
   requests compete with the appends for the one event loop).

Usage::

    .venv/bin/python bench/webhooks.py            # about two minutes
    .venv/bin/python bench/webhooks.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] != str(REPO):
    sys.path.insert(0, str(REPO))  # `python bench/webhooks.py` puts bench/ first (bench/whip.py)

from aiohttp import web  # noqa: E402

from registry.events import NewEvent  # noqa: E402
from registry.timeline import Timeline, TimelineConfig  # noqa: E402
from whip.webhooks.attempt_process import AttemptProcess  # noqa: E402
from whip.webhooks.config import WebhookConfig  # noqa: E402
from whip.webhooks.cursor import CursorState, FileCursorStore  # noqa: E402
from whip.webhooks.delivery_thread import DeliveryThread  # noqa: E402
from whip.webhooks.dispatcher import DEFAULT_SAVE_INTERVAL_S, WebhookDispatcher  # noqa: E402
from whip.webhooks.service import WebhookGroup  # noqa: E402

SECRET = os.urandom(32)


def log(message: str) -> None:
    print(f"[webhooks {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "p50_ms": at(0.50),
        "p90_ms": at(0.90),
        "p99_ms": at(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


async def serve_receiver() -> None:
    """The child process: answer 204 to every POST on 127.0.0.1; print the port; run
    until stdin closes (the parent exits or closes it)."""

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


async def fast_receiver() -> tuple[asyncio.subprocess.Process, str]:
    """The receiver child process (its own CPU, as a real receiver would be) and its URL."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve-receiver",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    port = int((await asyncio.wait_for(child.stdout.readline(), 30)).decode())
    return child, f"http://127.0.0.1:{port}/hook"


def webhook(name: str, url: str) -> WebhookConfig:
    return WebhookConfig(
        name=name,
        url=url,
        secret_key=SECRET,
        events=("run_created", "stream_warning"),
        retry_min_s=0.05,
        retry_max_s=0.5,
    )


def attempts(webhooks: int) -> AttemptProcess | None:
    """Where the group's HTTP attempts are made: a child process, as the server's
    (:mod:`whip.webhooks.attempt_process`), unless ``--attempts-in-thread``."""
    if not webhooks or ATTEMPTS_IN_THREAD[0]:
        return None
    return AttemptProcess("uvloop")


async def wait_cursor(dispatcher: WebhookDispatcher, seq: int, within_s: float) -> None:
    """Until the dispatcher's cursor reaches ``seq`` (bounded; polls its own state)."""
    deadline = time.monotonic() + within_s
    while dispatcher.ledger is None or dispatcher.ledger.upto < seq:
        if time.monotonic() > deadline:
            raise RuntimeError(f"cursor not at {seq} within {within_s} s: {dispatcher.status()}")
        await asyncio.sleep(0.005)


async def throughput(base: Path, url: str, backlog: int, runs: int) -> dict[str, Any]:
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(base / "throughput"))
    try:
        appends = [
            timeline.append(NewEvent(f"run{i % runs:04d}", "stream_warning", "bench", {"n": i}))
            for i in range(backlog)
        ]
        seqs = await asyncio.gather(*appends)
        await FileCursorStore(base / "throughput" / "webhooks").save("fast", CursorState(0))
        store = FileCursorStore(base / "throughput" / "webhooks")  # the delivery loop's
        dispatcher = WebhookDispatcher(webhook("fast", url), timeline, store)
        thread = DeliveryThread("uvloop")
        await thread.start()
        group = WebhookGroup([dispatcher], timeline, attempts=attempts(1))
        started = time.perf_counter()
        await thread.run(group.start())
        await wait_cursor(dispatcher, max(seqs), 600)
        elapsed = time.perf_counter() - started
        await thread.run(group.aclose())
        await thread.stop()
    finally:
        await asyncio.to_thread(timeline.close)
    return {
        "events": backlog,
        "runs": runs,
        "max_parallel_runs": dispatcher.webhook.max_parallel_runs,
        "seconds": round(elapsed, 3),
        "events_per_s": round(backlog / elapsed, 1),
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


async def ingest_mix(timeline: Timeline, appends: int, producers: int) -> list[float]:
    """What a server's timeline sees: each producer (a session) appends at a steady
    rate, mostly ``stats`` (not a default webhook type), every 10th event a lifecycle
    one; ``MIX_RATE_PER_S`` appends per second in all."""
    latencies: list[float] = []
    per_producer = appends // producers
    interval = producers / MIX_RATE_PER_S[0]

    async def producer(p: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time() + interval * p / producers
        for i in range(per_producer):
            delay = start + i * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            etype = "stream_warning" if i % 10 == 0 else "stats"
            event = NewEvent(f"mix{p:03d}", etype, "bench", {"n": i})
            t0 = time.perf_counter()
            await timeline.append(event)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(producer(p) for p in range(producers)))
    return latencies


MIX_RATE_PER_S = [100.0]
"""Appends per second of ``ingest_mix`` (``--mix-rate``): about what 100 live sessions
append (two tracks' ``stats`` every 5 s each, their lifecycle events, some analyzers)."""
SAVE_INTERVAL_S = [DEFAULT_SAVE_INTERVAL_S]
ATTEMPTS_IN_THREAD = [False]
WORKLOADS = {"ingest_mix": ingest_mix, "every_event_wanted": closed_loop}


async def confirm_latency(
    base: Path, url: str, appends: int, producers: int, webhooks: int, workload: str
) -> dict[str, Any]:
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(base / workload))
    store = FileCursorStore(base / workload / "webhooks")
    append_load = WORKLOADS[workload]
    rounds: list[dict[str, Any]] = []
    try:
        await append_load(timeline, appends // 4, producers)  # warm-up
        for order in (("none", "webhooks"), ("webhooks", "none")):
            figures: dict[str, Any] = {}
            for mode in order:
                count = webhooks if mode == "webhooks" else 0
                dispatchers = [
                    WebhookDispatcher(
                        webhook(f"hook{n:02d}", url),
                        timeline,
                        store,
                        save_interval_s=SAVE_INTERVAL_S[0],
                    )
                    for n in range(count)
                ]
                group = WebhookGroup(dispatchers, timeline, attempts=attempts(count))
                thread = DeliveryThread("uvloop")
                await thread.start()
                if dispatchers:
                    await thread.run(group.start())
                latencies = await append_load(timeline, appends, producers)
                for d in dispatchers:
                    await wait_cursor(d, timeline.snapshot.last_seq, 600)
                if dispatchers:
                    await thread.run(group.aclose())
                await thread.stop()
                figures[mode] = percentiles(latencies)
            figures["added_p50_percent"] = round(
                100 * (figures["webhooks"]["p50_ms"] / figures["none"]["p50_ms"] - 1), 1
            )
            figures["added_p99_percent"] = round(
                100 * (figures["webhooks"]["p99_ms"] / figures["none"]["p99_ms"] - 1), 1
            )
            rounds.append({"order": list(order), **figures})
            log(f"{workload} round {order}: {figures}")
    finally:
        await asyncio.to_thread(timeline.close)
    return {"appends": appends, "producers": producers, "webhooks": webhooks, "rounds": rounds}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    child, url = await fast_receiver()
    try:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            base = Path(tmp)
            log(f"throughput: {args.backlog} events in {args.runs} runs")
            result_throughput = await throughput(base, url, args.backlog, args.runs)
            log(f"throughput: {result_throughput}")
            latency = {
                workload: await confirm_latency(
                    base, url, args.appends, args.producers, args.webhooks, workload
                )
                for workload in args.workloads
            }
    finally:
        assert child.stdin is not None
        child.stdin.close()
        await asyncio.wait_for(child.wait(), 30)
    return {
        "benchmark": "webhooks",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "throughput": result_throughput,
        "confirm_latency": latency,
        "ingest_mix_rate_per_s": MIX_RATE_PER_S[0],
        "attempts": "thread" if ATTEMPTS_IN_THREAD[0] else "process",
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
        "--save-interval",
        type=float,
        default=DEFAULT_SAVE_INTERVAL_S,
        help="seconds between cursor saves of each webhook (the dispatcher's default)",
    )
    parser.add_argument(
        "--attempts-in-thread",
        action="store_true",
        help="HTTP attempts on the delivery thread's loop (before the attempt process)",
    )
    parser.add_argument("--serve-receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.backlog, args.runs, args.appends = 2_000, 20, 400
    return args


if __name__ == "__main__":
    arguments = parse_args()
    SAVE_INTERVAL_S[0] = arguments.save_interval
    MIX_RATE_PER_S[0] = arguments.mix_rate
    ATTEMPTS_IN_THREAD[0] = arguments.attempts_in_thread
    if arguments.serve_receiver:
        asyncio.run(serve_receiver())
    else:
        print(json.dumps(asyncio.run(main(arguments)), indent=2))
