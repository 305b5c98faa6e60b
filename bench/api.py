#!/usr/bin/env python3
"""Benchmark of the REST API's read paths against the real server process.

Prints exactly one JSON document on stdout; progress goes to stderr.

A data dir is built *before* the server starts, by opening a :class:`Timeline` on it
directly and appending:

- run A: ``run_created`` + ``session_closed`` (2 events; ended, so recovery does not
  append ``run_interrupted``);
- run B: ``run_created`` + 10,000 ``stats`` + ``session_closed``;
- ``--other-runs`` other runs (``run_created``, 3 ``stats``, ``session_closed``) whose
  events are interleaved with B's, so B's events are scattered over the WAL. B is
  appended last, so it is the newest run and recovery rebuilds its warm tail (the
  newest ``warm_runs`` = 1024 runs get the last 256 events each). B's event #100 is far
  outside its 256-event tail (cold: WAL through the index, in a thread); #9900 is
  inside it (warm: the published snapshot).

Then ``python -m whip serve`` is started on that data dir (loopback, anonymous mode;
PID recorded; SIGINT then SIGKILL at the end), ``/readyz`` is awaited and then the
warm-up of the tails (the ``whip_warm_runs`` gauge of ``/metrics`` stops changing).

Sections (client-side wall time of each request, ms, keep-alive connections):

1. ``get_run``: ``GET /v1/runs/A`` vs ``/v1/runs/B``, interleaved, at concurrency 1 and
   10; ``ratio_b_over_a`` of p50/p99 (target: 1 within noise; the route is O(1)).
2. ``events``: ``GET /v1/runs/B/events?after=<seq of #9900>&limit=100`` (warm) vs
   ``after=<seq of #100>`` (cold), interleaved, at concurrency 1 and 10;
   ``ratio_cold_over_warm``.
3. ``pollers``: 100 concurrent clients looping over reads for a fixed time (after an
   untimed 1 s that opens the connections): ``mixed`` (each client alternates warm and
   cold), then ``warm_only`` and ``cold_only``; requests/s and latency per kind, CPU of
   the server and of this (single-threaded client) process. Client and server share
   the host's CPUs: on a small host the client is part of what is measured.
4. ``long_poll_wake``: a real WHIP POST (aiortc offer, never connected) creates a live
   run; 100 clients long-poll its events (``wait=30``) after its ``run_created``; after
   a settle time ``DELETE /v1/runs/{id}`` appends ``run_deleted`` (+ ``session_closed``)
   and wakes them. Wake latency = answer received - DELETE sent.

Percentiles interpolate linearly between closest ranks.

Usage::

    .venv/bin/python bench/api.py            # default, about 1.5 min
    .venv/bin/python bench/api.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] != str(REPO):
    sys.path.insert(0, str(REPO))  # `python bench/api.py` puts bench/ first: whip = bench/whip.py

import aiohttp  # noqa: E402
from aiortc import RTCPeerConnection  # noqa: E402
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack  # noqa: E402

from registry.events import EventType, NewEvent  # noqa: E402
from registry.timeline import Timeline, TimelineConfig  # noqa: E402
from whip.rtc.host_addresses import restrict_host_addresses  # noqa: E402
from whip.rtc.peer import new_peer_connection  # noqa: E402


def _load_bench_whip() -> Any:
    """bench/whip.py's helpers (start_server, summary, ...) under a name that is not ``whip``."""
    spec = importlib.util.spec_from_file_location("bench_whip_helpers", REPO / "bench" / "whip.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


bw = _load_bench_whip()
HOST = bw.HOST
PRINCIPAL = "anonymous"
B_EVENTS = 10_000
WARM_INDEX = 9900
COLD_INDEX = 100
READ_LIMIT = 100


def log(message: str) -> None:
    print(f"[bench/api {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ms_summary(values: list[float]) -> dict[str, Any]:
    return bw.summary([v * 1000 for v in values], 3)


def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    if a.get(key) and b.get(key):
        return round(b[key] / a[key], 3)
    return None


# ---------------------------------------------------------------- the data dir


def build_data_dir(data_dir: Path, other_runs: int) -> dict[str, Any]:
    """Append A, B (interleaved with the other runs) through a directly opened Timeline."""
    started = time.monotonic()
    timeline = Timeline.open(TimelineConfig(data_dir))
    wal = timeline.wal

    def submit(run_id: str, etype: str, data: dict[str, Any]) -> Any:
        return wal.submit_blocking(NewEvent(run_id, etype, PRINCIPAL, data), 60)

    def created(run_id: str) -> dict[str, Any]:
        return {"stream": f"s-{run_id}", "session_id": "", "codecs": ["H264", "opus"]}

    def stats(i: int) -> dict[str, Any]:
        return {
            "frames_decoded": i * 30,
            "fps": 30.0,
            "bitrate_bps": 1_200_000 + i,
            "width": 1280,
            "height": 720,
            "drops": 0,
            "queue_depth": 1,
        }

    try:
        run_a, run_b = "bench-run-a", "bench-run-b"
        submit(run_a, EventType.RUN_CREATED, created(run_a))
        submit(run_a, EventType.SESSION_CLOSED, {"reason": "client"}).result(60)
        b_futures = [submit(run_b, EventType.RUN_CREATED, created(run_b))]
        others = [f"bench-other-{j:05d}" for j in range(other_runs)]
        every = max(1, B_EVENTS // max(1, other_runs))
        pending: list[Any] = []
        other_iter = iter(others)
        for i in range(B_EVENTS):
            b_futures.append(submit(run_b, EventType.STATS, stats(i)))
            if i % every == every - 1:
                run = next(other_iter, None)
                if run is not None:
                    pending.append(submit(run, EventType.RUN_CREATED, created(run)))
                    for k in range(3):
                        pending.append(submit(run, EventType.STATS, stats(k)))
                    pending.append(submit(run, EventType.SESSION_CLOSED, {"reason": "client"}))
        for run in other_iter:  # when other_runs > B_EVENTS
            pending.append(submit(run, EventType.RUN_CREATED, created(run)))
            pending.append(submit(run, EventType.SESSION_CLOSED, {"reason": "client"}))
        b_futures.append(submit(run_b, EventType.SESSION_CLOSED, {"reason": "client"}))
        b_seqs = [f.result(60) for f in b_futures]
        for f in pending:
            f.result(60)
        last_seq = wal.next_seq - 1
    finally:
        timeline.close()
    wal_bytes = sum(p.stat().st_size for p in (data_dir / "wal").rglob("*") if p.is_file())
    out = {
        "run_a": run_a,
        "run_b": run_b,
        "run_a_events": 2,
        "run_b_events": len(b_seqs),
        "other_runs": other_runs,
        "events_total": last_seq,
        "wal_bytes": wal_bytes,
        "build_s": round(time.monotonic() - started, 3),
        "b_seqs": b_seqs,
    }
    log(
        f"data dir built: {last_seq} events, {other_runs + 2} runs, "
        f"{wal_bytes / 1e6:.1f} MB WAL in {out['build_s']} s"
    )
    return out


# ---------------------------------------------------------------- helpers


async def wait_warm(http: aiohttp.ClientSession, base: str, bound_s: float) -> dict[str, Any]:
    """Poll the warm_runs gauge until it has not changed for 1 s (bounded)."""
    started = time.monotonic()
    last, stable_since, value = None, started, None
    while time.monotonic() - started < bound_s:
        async with http.get(f"{base}/metrics") as response:
            text = await response.text()
        for line in text.splitlines():
            if line.startswith("whip_warm_runs "):
                value = float(line.split()[1])
        if value != last:
            last, stable_since = value, time.monotonic()
        elif time.monotonic() - stable_since >= 1.0:
            break
        await asyncio.sleep(0.1)
    waited = round(time.monotonic() - started, 3)
    log(f"warm_runs gauge {value} (stable; waited {waited} s)")
    return {"warm_runs": value, "waited_s": waited}


async def timed_get(http: aiohttp.ClientSession, url: str) -> tuple[float, int, bytes]:
    started = time.perf_counter()
    async with http.get(url) as response:
        body = await response.read()
        status = response.status
    return time.perf_counter() - started, status, body


async def interleaved(
    http: aiohttp.ClientSession, urls: dict[str, str], n_each: int, concurrency: int
) -> dict[str, Any]:
    """n_each GETs of every url, interleaved (a, b, a, b...), ``concurrency`` workers."""
    names = list(urls)
    jobs = [names[i % len(names)] for i in range(n_each * len(names))]
    it = iter(jobs)
    lat: dict[str, list[float]] = {name: [] for name in names}
    errors: dict[str, int] = dict.fromkeys(names, 0)

    async def worker() -> None:
        for name in it:
            elapsed, status, _ = await timed_get(http, urls[name])
            if status != 200:
                errors[name] += 1
            lat[name].append(elapsed)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    out: dict[str, Any] = {"concurrency": concurrency, "wall_s": round(wall, 3)}
    out["requests_per_s"] = round(len(jobs) / wall, 1)
    for name in names:
        out[name] = ms_summary(lat[name]) | {"errors": errors[name]}
    return out


async def poller_phase(
    http: aiohttp.ClientSession,
    urls: dict[str, str],
    kinds: list[str],
    clients: int,
    seconds: float,
    pid: int,
) -> dict[str, Any]:
    """``clients`` loops of GETs for ``seconds``; client i cycles ``kinds`` from offset i."""
    lat: dict[str, list[float]] = {k: [] for k in kinds}
    errors: dict[str, int] = dict.fromkeys(kinds, 0)
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        for kind in itertools.islice(itertools.cycle(kinds), i % len(kinds), None):
            if time.perf_counter() >= deadline:
                return
            elapsed, status, _ = await timed_get(http, urls[kind])
            if status != 200:
                errors[kind] += 1
            lat[kind].append(elapsed)

    cpu0 = bw.proc_status(pid).get("cpu_ms", 0)
    client_cpu0 = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.perf_counter() - started
    cpu1 = bw.proc_status(pid).get("cpu_ms", 0)
    total = sum(len(v) for v in lat.values())
    out: dict[str, Any] = {
        "clients": clients,
        "wall_s": round(wall, 3),
        "requests": total,
        "requests_per_s": round(total / wall, 1),
        "server_cpu_pct": round((cpu1 - cpu0) / 10 / wall, 1),
        "client_cpu_pct": round((time.process_time() - client_cpu0) * 100 / wall, 1),
    }
    for kind in kinds:
        out[kind] = ms_summary(lat[kind]) | {
            "requests_per_s": round(len(lat[kind]) / wall, 1),
            "errors": errors[kind],
        }
    return out


# ---------------------------------------------------------------- long-poll wake


async def make_offer() -> tuple[RTCPeerConnection, str]:
    pc = new_peer_connection()
    pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
    pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, str(pc.localDescription.sdp)


async def long_poll_round(
    http: aiohttp.ClientSession, base: str, index: int, pollers: int, settle_s: float
) -> dict[str, Any]:
    pc, offer = await make_offer()
    try:
        async with http.post(
            f"{base}/whip/bench-lp-{index}",
            data=offer,
            headers={"Content-Type": "application/sdp"},
        ) as response:
            await response.read()
            if response.status != 201:
                raise RuntimeError(f"WHIP POST answered {response.status}")
            run_id = response.headers["X-Run-Id"]
        async with http.get(f"{base}/v1/runs/{run_id}/events?after=0") as response:
            items = (await response.json())["items"]
        created_seq = next(e["seq"] for e in items if e["type"] == "run_created")
        after = items[-1]["seq"]
        url = f"{base}/v1/runs/{run_id}/events?after={after}&limit=100&wait=30"
        answered: list[tuple[float, int, list[str]]] = []

        async def poller() -> None:
            async with http.get(url) as response:
                body = await response.json()
                answered.append(
                    (time.perf_counter(), response.status, [e["type"] for e in body["items"]])
                )

        tasks = [asyncio.ensure_future(poller()) for _ in range(pollers)]
        await asyncio.sleep(settle_s)
        early = len(answered)
        sent = time.perf_counter()
        async with http.delete(f"{base}/v1/runs/{run_id}") as response:
            delete_body = await response.json()
            delete_status = response.status
        delete_done = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*tasks), 35)
        wakes = [t - sent for t, _, _ in answered]
        first_types = sorted({types[0] if types else "" for _, _, types in answered})
        return {
            "run_id": run_id,
            "created_seq": created_seq,
            "events_before_poll": len(items),
            "answered_before_delete": early,
            "delete_status": delete_status,
            "delete_ms": round((delete_done - sent) * 1000, 3),
            "deleted_seq": delete_body.get("event", {}).get("seq"),
            "statuses": sorted({s for _, s, _ in answered}),
            "first_event_types": first_types,
            "wake_s": wakes,
            "wake_after_delete_answer_s": [t - delete_done for t, _, _ in answered],
        }
    finally:
        await pc.close()


async def long_poll_section(
    http: aiohttp.ClientSession, base: str, rounds: int, pollers: int, settle_s: float
) -> dict[str, Any]:
    per_round = []
    wakes: list[float] = []
    after_answer: list[float] = []
    for index in range(rounds):
        result = await long_poll_round(http, base, index, pollers, settle_s)
        wakes += result.pop("wake_s")
        after_answer += result.pop("wake_after_delete_answer_s")
        rw = sorted(w * 1000 for w in wakes[-pollers:])
        result["wake_ms_p50"] = round(bw.percentile(rw, 0.5), 3)
        result["wake_ms_max"] = round(rw[-1], 3) if rw else None
        per_round.append(result)
        log(f"long-poll round {index}: {result}")
    return {
        "pollers": pollers,
        "rounds": rounds,
        "settle_s": settle_s,
        "wake_ms": ms_summary(wakes),
        "wake_minus_delete_answer_ms": ms_summary(after_answer),
        "per_round": per_round,
    }


# ---------------------------------------------------------------- main


async def bench(args: argparse.Namespace, server: Any, built: dict[str, Any]) -> dict[str, Any]:
    base = server.base
    run_a, run_b = built["run_a"], built["run_b"]
    b_seqs = built["b_seqs"]
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=bw.HTTP_TIMEOUT_S + 35)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await server.wait_ready()
        out["warm_up"] = await wait_warm(http, base, 30.0)
        run_urls = {"A": f"{base}/v1/runs/{run_a}", "B": f"{base}/v1/runs/{run_b}"}
        ev_urls = {
            "warm": f"{base}/v1/runs/{run_b}/events?after={b_seqs[WARM_INDEX]}&limit={READ_LIMIT}",
            "cold": f"{base}/v1/runs/{run_b}/events?after={b_seqs[COLD_INDEX]}&limit={READ_LIMIT}",
        }
        # Correctness of what we time: both reads answer the 100 events that follow.
        check = {}
        for kind, index in (("warm", WARM_INDEX), ("cold", COLD_INDEX)):
            _, status, body = await timed_get(http, ev_urls[kind])
            items = json.loads(body)["items"]
            expected = b_seqs[index + 1 : index + 1 + READ_LIMIT]
            check[kind] = {
                "status": status,
                "items": len(items),
                "seqs_match": [e["seq"] for e in items] == expected,
                "body_bytes": len(body),
            }
        for name, url in run_urls.items():
            _, status, body = await timed_get(http, url)
            check[f"run_{name}"] = {"status": status, "body": json.loads(body)}
        out["checks"] = check
        log(f"checks: {check}")

        # untimed warm-up of connections and code paths
        await interleaved(http, run_urls | ev_urls, 50, 10)

        out["get_run"] = {}
        for conc in (1, 10):
            r = await interleaved(http, run_urls, args.run_requests, conc)
            r["ratio_b_over_a"] = {q: ratio(r["A"], r["B"], q) for q in ("p50", "p99", "mean")}
            out["get_run"][f"c{conc}"] = r
            log(f"get_run c{conc}: A {r['A']} B {r['B']} ratio {r['ratio_b_over_a']}")

        out["events"] = {}
        for conc in (1, 10):
            r = await interleaved(http, ev_urls, args.event_requests, conc)
            r["ratio_cold_over_warm"] = {
                q: ratio(r["warm"], r["cold"], q) for q in ("p50", "p99", "mean")
            }
            out["events"][f"c{conc}"] = r
            log(
                f"events c{conc}: warm {r['warm']} cold {r['cold']} ratio "
                f"{r['ratio_cold_over_warm']}"
            )

        # untimed: open the 100 keep-alive connections and warm both paths first
        await poller_phase(http, ev_urls, ["warm", "cold"], args.pollers, 1.0, server.pid)
        out["pollers"] = {}
        for label, kinds, seconds in (
            ("mixed", ["warm", "cold"], args.poll_seconds),
            ("warm_only", ["warm"], args.poll_seconds_single),
            ("cold_only", ["cold"], args.poll_seconds_single),
        ):
            r = await poller_phase(http, ev_urls, kinds, args.pollers, seconds, server.pid)
            if label == "mixed":
                r["ratio_cold_over_warm"] = {
                    q: ratio(r["warm"], r["cold"], q) for q in ("p50", "p99", "mean")
                }
            out["pollers"][label] = r
            log(f"pollers {label}: {r}")

        restrict_host_addresses([HOST])  # aioice skips 127.0.0.1 by default
        out["long_poll_wake"] = await long_poll_section(
            http, base, args.lp_rounds, args.pollers, args.lp_settle
        )
        out["server_status_end"] = bw.proc_status(server.pid)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer requests")
    parser.add_argument("--other-runs", type=int, default=2000)
    parser.add_argument("--run-requests", type=int, default=None, help="per run, per level")
    parser.add_argument("--event-requests", type=int, default=None, help="per kind, per level")
    parser.add_argument("--pollers", type=int, default=100)
    parser.add_argument("--poll-seconds", type=float, default=None)
    parser.add_argument("--lp-rounds", type=int, default=None)
    parser.add_argument("--lp-settle", type=float, default=1.0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    quick = args.quick
    args.run_requests = args.run_requests or (300 if quick else 2000)
    args.event_requests = args.event_requests or (200 if quick else 1000)
    args.poll_seconds = args.poll_seconds or (3.0 if quick else 10.0)
    args.poll_seconds_single = max(1.0, args.poll_seconds / 2)
    args.lp_rounds = args.lp_rounds or (2 if quick else 5)

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    log(f"temporary directory {tmp}")
    result: dict[str, Any] = {
        "bench": "api",
        "quick": quick,
        "params": dict(vars(args)),
        "host": {
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
            "fs": bw.fs_type(tmp),
            "load_before": bw.host_load(),
        },
    }
    server = None
    try:
        data_dir = tmp / "data"
        built = build_data_dir(data_dir, args.other_runs)
        result["data"] = {k: v for k, v in built.items() if k != "b_seqs"} | {
            "b_seq_first": built["b_seqs"][0],
            "b_seq_cold_after": built["b_seqs"][COLD_INDEX],
            "b_seq_warm_after": built["b_seqs"][WARM_INDEX],
            "b_seq_last": built["b_seqs"][-1],
        }
        server = bw.start_server(data_dir, tmp / "server.log", 16)
        result["server"] = {"pid": server.pid, "port": server.port, "cmd": server.cmd}
        result |= asyncio.run(bench(args, server, built))
        result["server"]["ready_s"] = server.ready_s
    finally:
        if server is not None:
            server.shutdown()
            result.setdefault("server", {})["stop"] = server.stop
            result["server"]["log_problems"] = server.problems(first=20)
        result["host"]["load_after"] = bw.host_load()
        result["runtime_s"] = round(time.monotonic() - started, 1)
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
