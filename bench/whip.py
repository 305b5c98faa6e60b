#!/usr/bin/env python3
"""Benchmark of the WHIP endpoint against the real server process.

Prints exactly one JSON document on stdout; progress goes to stderr.

The server is started as a subprocess (``python -m whip serve``) on a free loopback port
with a fresh ``--data-dir`` in a temporary directory, and stopped with SIGINT (its PID is
recorded; SIGKILL only if it does not exit within the deadline). Everything stays on
127.0.0.1: the server advertises only loopback candidates (it is bound to loopback) and
this process restricts aioice's host candidates to 127.0.0.1 too.

Sections:

1. ``post_201``: POST -> 201 latency, client-side wall time of each request (send offer,
   read the whole answer), at each ``--levels`` concurrency. The aiortc offers (audio +
   video, gathering complete) are created before the timed part. Requests go out in
   waves of ``concurrency``; every wave starts after the previous one has been answered
   *and* its sessions DELETEd (the deletes are timed separately, not counted). One
   untimed warm-up wave precedes each level. The server's own handler time (its
   ``201 in X ms`` log line) is matched per session, so ``client - server`` shows the
   time a request waited before its handler ran. Server RSS/threads/fds come from
   ``/proc/<pid>/status``.
2. ``connect``: time from POST to connected, ``--repetitions`` times each for

   - an aiortc publisher: POST, apply the answer, wait for its connectionState
     ``connected`` (client-side), plus the server's ``session_connected``
     ``ms_since_post`` read from the timeline after the server has stopped;
   - FFmpeg's WHIP muxer through PyAV: from ``av.open`` to the first packet whose
     ``mux()`` returned (PyAV writes the header, i.e. runs the whole WHIP handshake,
     on the first mux), plus the server's ``ms_since_post`` and FFmpeg's own
     ``elapsed=`` breakdown from its log.

   The first *decoded* frame cannot be measured yet: no pipeline decodes media.

Percentiles interpolate linearly between closest ranks. Run as ``python bench/whip.py``,
``bench/`` is ``sys.path[0]`` and this module itself would shadow the ``whip`` package:
the repository root goes first on ``sys.path`` before anything is imported.

Usage::

    .venv/bin/python bench/whip.py            # default, about a minute
    .venv/bin/python bench/whip.py --quick    # smoke run, well under 60 s
    .venv/bin/python bench/whip.py --levels 1,10,50 --requests 200 --repetitions 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import fractions
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] != str(REPO):
    sys.path.insert(0, str(REPO))  # before bench/ (this module would shadow ``whip``)

import aiohttp  # noqa: E402
import aioice  # noqa: E402
from aiortc import RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack  # noqa: E402

from bench.support import server_process  # noqa: E402
from registry.timeline import Timeline, TimelineConfig  # noqa: E402
from whip.rtc.host_addresses import restrict_host_addresses  # noqa: E402
from whip.rtc.peer import new_peer_connection  # noqa: E402

HOST = server_process.HOST
STOP_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
_LOG_201 = re.compile(r"session (s_[A-Za-z0-9_-]+) run (r_[A-Za-z0-9_-]+): 201 in ([0-9.]+) ms")
FFMPEG_PHASES = ("total", "init", "offer", "answer", "udp", "ice", "dtls", "srtp")
_FFMPEG_ELAPSED = re.compile(r"Muxer state=.*elapsed=([0-9.]+)ms\(([^)]*)\)")


def log(message: str) -> None:
    server_process.log("bench/whip", message)


# ---------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (``q`` in [0, 1])."""
    if not sorted_values:
        return math.nan
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summary(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """n, min, p50, p90, p99, max, mean of ``values`` (empty: only n)."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    out: dict[str, Any] = {"n": len(ordered), "min": ordered[0]}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        out[name] = percentile(ordered, q)
    out["max"] = ordered[-1]
    out["mean"] = statistics.fmean(ordered)
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in out.items()}


# ---------------------------------------------------------------- the server process


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM (KiB), threads, fds and CPU time (user+system) of ``pid``."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[f"{key.lower()}_kib"] = int(value.split()[0])
                elif key == "Threads":
                    out["threads"] = int(value)
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        # utime and stime are fields 14 and 15 of /proc/<pid>/stat (1-based, after comm).
        out["cpu_ms"] = (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return out


def host_load() -> dict[str, Any]:
    """Load average and CPU pressure (PSI): other work on the host skews wall times."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        out["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    with contextlib.suppress(OSError):
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        out["cpu_pressure_some"] = dict(kv.split("=") for kv in some.split()[1:4])
    return out


def fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def start_server(data_dir: Path, log_path: Path, max_sessions: int) -> server_process.ServerProcess:
    """A fresh ``python -m whip serve`` with room for ``max_sessions`` (limits and a media
    budget that never refuses a benchmark session)."""
    return server_process.ServerProcess(
        "bench/whip",
        data_dir,
        log_path,
        max_sessions,
        {**server_process.media_budget_env(max_sessions), "WHIP_INGEST_LOG_LEVEL": "INFO"},
        stop_timeout_s=STOP_TIMEOUT_S,
    )


def handler_ms(log_path: Path) -> dict[str, float]:
    """session id -> the server's own POST handler time (its log line)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for match in _LOG_201.finditer(log_path.read_text(errors="replace")):
            out[match[1]] = float(match[3])
    return out


# ---------------------------------------------------------------- publishers


def new_publisher() -> RTCPeerConnection:
    pc = new_peer_connection()
    pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
    pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
    return pc


async def prepared_offer() -> tuple[RTCPeerConnection, str]:
    """A publisher pc and its offer (gathering complete); the pc is kept open so the
    server's ICE checks reach a live socket, as they would for a real client."""
    pc = new_publisher()
    await pc.setLocalDescription(await pc.createOffer())
    return pc, str(pc.localDescription.sdp)


SDP_HEADERS = {"Content-Type": "application/sdp"}


@dataclass
class PostResult:
    wave: int
    slot: int
    ms: float
    status: int
    location: str = ""
    session_id: str = ""
    run_id: str = ""
    error: str = ""


async def timed_post(
    http: aiohttp.ClientSession, url: str, sdp: str, wave: int, slot: int
) -> PostResult:
    started = time.perf_counter()
    try:
        async with http.post(url, data=sdp, headers=SDP_HEADERS) as response:
            await response.read()
            ms = (time.perf_counter() - started) * 1000
            location = response.headers.get("Location", "")
            return PostResult(
                wave,
                slot,
                ms,
                response.status,
                location,
                location.rsplit("/", 1)[-1] if location else "",
                response.headers.get("X-Run-Id", ""),
            )
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        ms = (time.perf_counter() - started) * 1000
        return PostResult(wave, slot, ms, 0, error=f"{type(exc).__name__}: {exc}"[:300])


async def timed_delete(http: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        async with http.delete(url) as response:
            await response.read()
            return response.status, (time.perf_counter() - started) * 1000
    except (aiohttp.ClientError, TimeoutError, OSError):
        return 0, (time.perf_counter() - started) * 1000


# ---------------------------------------------------------------- section 1


async def post_level(
    http: aiohttp.ClientSession,
    server: server_process.ServerProcess,
    concurrency: int,
    requests: int,
) -> dict[str, Any]:
    """``requests`` timed POSTs in waves of ``concurrency`` (after one warm-up wave)."""
    url = f"{server.base}/whip"
    warmup_n = min(concurrency, requests)
    log(f"level {concurrency}: preparing {warmup_n + requests} offers")
    prep_started = time.monotonic()
    prepared = [await prepared_offer() for _ in range(warmup_n + requests)]
    prep_s = time.monotonic() - prep_started
    offers = [sdp for _, sdp in prepared]
    status_before = proc_status(server.pid)

    async def wave(index: int, batch: list[str]) -> tuple[list[PostResult], float, list[float]]:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(timed_post(http, url, sdp, index, slot) for slot, sdp in enumerate(batch))
        )
        took = time.perf_counter() - started
        deletes = await asyncio.gather(
            *(timed_delete(http, server.base + r.location) for r in results if r.location)
        )
        delete_statuses.update(str(status) for status, _ in deletes)
        return list(results), took, [ms for _, ms in deletes]

    delete_statuses: Counter[str] = Counter()
    warm_results, warm_s, _ = await wave(-1, offers[:warmup_n])
    delete_statuses.clear()
    cpu_before = proc_status(server.pid).get("cpu_ms")
    load_before = host_load()
    results: list[PostResult] = []
    delete_ms: list[float] = []
    posting_s = 0.0
    level_started = time.perf_counter()
    for index, start in enumerate(range(warmup_n, len(offers), concurrency)):
        batch_results, took, deleted = await wave(index, offers[start : start + concurrency])
        results.extend(batch_results)
        delete_ms.extend(deleted)
        posting_s += took
    wall_s = time.perf_counter() - level_started
    status_after = proc_status(server.pid)
    load_after = host_load()
    cpu_after = status_after.get("cpu_ms")
    cpu_per_post = (
        round((cpu_after - cpu_before) / len(results), 2)
        if cpu_before is not None and cpu_after is not None and results
        else None
    )
    await asyncio.gather(*(pc.close() for pc, _ in prepared))
    await asyncio.sleep(1.0)
    status_settled = proc_status(server.pid)

    ok = [r for r in results if r.status == 201]
    statuses = Counter(str(r.status) for r in results)
    errors = Counter(r.error for r in results if r.error)
    level = {
        "concurrency": concurrency,
        "requests": len(results),
        "waves": math.ceil(requests / concurrency),
        "offer_prep_s": round(prep_s, 2),
        "statuses": dict(statuses),
        "errors": dict(errors),
        "latency_ms": summary([r.ms for r in ok]),
        "throughput_rps": round(len(ok) / posting_s, 1) if posting_s else None,
        "posting_s": round(posting_s, 3),
        "wall_s_including_deletes": round(wall_s, 3),
        "server_cpu_ms_per_request_incl_delete": cpu_per_post,
        "host_load": {"before": load_before, "after": load_after},
        "warmup": {
            "requests": len(warm_results),
            "statuses": dict(Counter(str(r.status) for r in warm_results)),
            "latency_ms": summary([r.ms for r in warm_results if r.status == 201]),
            "wave_s": round(warm_s, 3),
        },
        "delete": {"statuses": dict(delete_statuses), "latency_ms": summary(delete_ms)},
        "server_before": status_before,
        "server_after": status_after,
        "server_after_1s_settle": status_settled,
    }
    log(
        f"level {concurrency}: {dict(statuses)} p50 {level['latency_ms'].get('p50')} ms "
        f"p99 {level['latency_ms'].get('p99')} ms, {level['throughput_rps']} req/s"
    )
    return {"summary": level, "results": results, "warmup_results": warm_results}


def annotate_levels(
    levels: list[dict[str, Any]], handler_ms: dict[str, float], runs: dict[str, dict[str, Any]]
) -> None:
    """Add the server-side handler times, wait-before-handler and close reasons."""
    for level in levels:
        summary_doc = level["summary"]
        results: list[PostResult] = level["results"]
        matched = [(r, handler_ms[r.session_id]) for r in results if r.session_id in handler_ms]
        summary_doc["server_handler_ms"] = summary([ms for _, ms in matched])
        summary_doc["client_minus_server_ms"] = summary([r.ms - ms for r, ms in matched])
        reasons: Counter[str] = Counter()
        connected = 0
        for r in results + level["warmup_results"]:
            run = runs.get(r.run_id)
            if run is None:
                continue
            reasons[str(run.get("closed_reason"))] += 1
            connected += run.get("connected_ms") is not None
        summary_doc["timeline"] = {"close_reasons": dict(reasons), "connected": connected}
        slowest = sorted(results, key=lambda r: r.ms, reverse=True)[:5]
        summary_doc["slowest"] = [
            {
                "ms": round(r.ms, 2),
                "status": r.status,
                "wave": r.wave,
                "slot_in_wave": r.slot,
                "server_handler_ms": handler_ms.get(r.session_id),
            }
            for r in slowest
        ]
        per_wave: dict[int, list[float]] = {}
        for r in results:
            per_wave.setdefault(r.wave, []).append(r.ms)
        if summary_doc["concurrency"] > 1:
            summary_doc["per_wave_max_ms"] = [round(max(v), 1) for _, v in sorted(per_wave.items())]


# ---------------------------------------------------------------- section 2: aiortc


async def aiortc_connect_once(
    http: aiohttp.ClientSession, server: server_process.ServerProcess, index: int, hold_s: float
) -> dict[str, Any]:
    pc = new_publisher()
    marks: dict[str, float] = {}
    connected = asyncio.Event()
    started = 0.0

    @pc.on("connectionstatechange")
    def on_state() -> None:
        marks.setdefault(f"pc_{pc.connectionState}", time.perf_counter())
        if pc.connectionState in ("connected", "failed", "closed"):
            connected.set()

    @pc.on("iceconnectionstatechange")
    def on_ice() -> None:
        marks.setdefault(f"ice_{pc.iceConnectionState}", time.perf_counter())

    out: dict[str, Any] = {"index": index}
    location = ""
    try:
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription.sdp
        started = time.perf_counter()
        async with http.post(
            f"{server.base}/whip/aiortc-{index}", data=offer, headers=SDP_HEADERS
        ) as response:
            answer = await response.text()
            marks["201"] = time.perf_counter()
            out["status"] = response.status
            location = response.headers.get("Location", "")
            out["run_id"] = response.headers.get("X-Run-Id", "")
        if out["status"] != 201:
            out["error"] = f"POST {out['status']}: {answer[:200]}"
            return out
        out["answer_setup"] = sorted(set(re.findall(r"a=setup:(\w+)", answer)))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        marks["answer_applied"] = time.perf_counter()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await connected.wait()
        except TimeoutError:
            out["error"] = f"not connected within {CONNECT_TIMEOUT_S} s"
        out["final_state"] = pc.connectionState
        if hold_s > 0 and pc.connectionState == "connected":
            await asyncio.sleep(hold_s)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if location:
            out["delete_status"], _ = await timed_delete(http, server.base + location)
        await pc.close()
    out["ms"] = {k: round((v - started) * 1000, 2) for k, v in sorted(marks.items())}
    return out


# ---------------------------------------------------------------- section 2: FFmpeg


def ffmpeg_connect_once(url: str, push_s: float, fps: int = 30) -> dict[str, Any]:
    """Open FFmpeg's WHIP muxer, time until the first mux returns, push ``push_s`` of
    paced media, close (the muxer DELETEs its session). Blocking; run in a thread."""
    import av
    import av.logging
    import numpy as np

    width, height = 320, 180
    out: dict[str, Any] = {"url": url}
    ms: dict[str, float] = {}
    started = time.perf_counter()

    def mark(name: str) -> None:
        ms[name] = round((time.perf_counter() - started) * 1000, 2)

    av.logging.set_level(av.logging.VERBOSE)  # FFmpeg's "elapsed=" breakdown is VERBOSE
    with contextlib.ExitStack() as stack:
        stack.callback(av.logging.set_level, None)
        logs = stack.enter_context(av.logging.Capture(local=True))
        try:
            container = av.open(url, mode="w", format="whip", options={"handshake_timeout": "5000"})
            mark("opened")
            try:
                video = container.add_stream("libx264", rate=fps)
                video.width, video.height, video.pix_fmt = width, height, "yuv420p"
                video.codec_context.gop_size = fps
                video.codec_context.max_b_frames = 0
                video.codec_context.options = {
                    "preset": "ultrafast",
                    "tune": "zerolatency",
                    "profile": "baseline",
                }
                video.codec_context.time_base = fractions.Fraction(1, fps)
                audio = container.add_stream("libopus", rate=48000, layout="stereo")
                frames = max(1, int(push_s * fps))
                silence = np.zeros((1, 960 * 2), dtype=np.int16)
                pace_start = time.monotonic()
                for index in range(frames):
                    delay = pace_start + index / fps - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    shade = np.full((height, width, 3), (index * 7) % 256, dtype=np.uint8)
                    frame = av.VideoFrame.from_ndarray(shade, format="rgb24")
                    frame = frame.reformat(format="yuv420p")
                    frame.pts = index
                    frame.time_base = fractions.Fraction(1, fps)
                    for packet in video.encode(frame):
                        if "first_mux_done" not in ms:
                            mark("first_mux_start")
                        container.mux(packet)
                        if "first_mux_done" not in ms:
                            mark("first_mux_done")
                    if index % 3 == 0:  # 5 x 20 ms of audio per 3 video frames
                        for chunk in range(5):
                            block = av.AudioFrame.from_ndarray(
                                silence, format="s16", layout="stereo"
                            )
                            block.sample_rate = 48000
                            block.pts = (index // 3 * 5 + chunk) * 960
                            block.time_base = fractions.Fraction(1, 48000)
                            for packet in audio.encode(block):
                                container.mux(packet)
                out["video_frames"] = frames
                mark("pushed")
            finally:
                container.close()
                mark("closed")
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    captured = [entry[2] for entry in logs if isinstance(entry[2], str)]
    out["ms"] = ms
    for line in captured:
        match = _FFMPEG_ELAPSED.search(line)
        if match:
            parts = dict(p.split(":", 1) for p in match[2].split(",") if ":" in p)
            out["ffmpeg_elapsed_ms"] = {"total": float(match[1])} | {
                k.strip(): float(v) for k, v in parts.items() if re.fullmatch(r"[0-9.]+", v)
            }
            break
    out["ffmpeg_log_errors"] = [
        line.strip() for line in captured if "Failed" in line or "failed" in line
    ][:5]
    return out


# ---------------------------------------------------------------- timeline


def read_timeline(data_dir: Path) -> dict[str, dict[str, Any]]:
    """run id -> stream, session_connected ms_since_post, close reason (server stopped)."""
    timeline = Timeline.open(TimelineConfig(data_dir))
    try:
        runs: dict[str, dict[str, Any]] = {}
        for view in timeline.runs.list_runs():
            info: dict[str, Any] = {}
            after = 0
            for _ in range(100):
                events = timeline.read_run_events(view.run_id, after, 1000)
                if not events:
                    break
                for event in events:
                    if event.type == "run_created":
                        info["stream"] = event.data.get("stream", "")
                        info["created_ts_ms"] = event.ts_ms
                    elif event.type == "session_connected":
                        info["connected_ms"] = event.data.get("ms_since_post")
                    elif event.type == "first_frame":
                        info["first_frame_ms"] = event.data.get("ms_since_post")
                    elif event.type == "session_closed":
                        info["closed_reason"] = event.data.get("reason")
                        info["closed_ts_ms"] = event.ts_ms
                after = events[-1].seq
            runs[view.run_id] = info
        return runs
    finally:
        timeline.close()


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="WHIP POST->201 latency and POST->connected times against the real server"
    )
    parser.add_argument("--quick", action="store_true", help="small counts (< 60 s)")
    parser.add_argument(
        "--levels", default=None, help="comma-separated concurrency levels (default 1,10,50)"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="timed POSTs per level (default 200)"
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=None,
        help="connect repetitions per publisher kind (default 10)",
    )
    parser.add_argument(
        "--push-seconds",
        type=float,
        default=None,
        help="media each connect repetition pushes before closing (default 1.0)",
    )
    parser.add_argument(
        "--skip-post", action="store_true", help="skip section 1 (POST->201 under concurrency)"
    )
    parser.add_argument(
        "--skip-connect", action="store_true", help="skip section 2 (POST->connected)"
    )
    parser.add_argument("--keep-data", action="store_true", help="keep the temp dir and log")
    parser.add_argument(
        "--long-push",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="instead of the other sections: one FFmpeg WHIP push this long (e.g. 600), "
        "checking it is never cut, with server RSS sampled every 10 s",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.levels = [int(x) for x in (args.levels or "1,10,50").split(",") if x.strip()]
    if args.requests is None:
        args.requests = 50 if quick else 200
    if args.repetitions is None:
        args.repetitions = 3 if quick else 10
    if args.push_seconds is None:
        args.push_seconds = 0.5 if quick else 1.0
    if not args.levels or min(args.levels) < 1 or args.requests < 1 or args.repetitions < 0:
        parser.error("levels and requests must be >= 1, repetitions >= 0")
    return args


async def long_push(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """One FFmpeg push of ``args.long_push`` seconds: it must stay connected to the end."""
    restrict_host_addresses([HOST])  # aioice skips 127.0.0.1 by default
    data_dir = base / "data"
    server = start_server(data_dir, base / "server.log", 10)
    samples: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    try:
        await server.wait_ready()
        started = time.monotonic()
        push = asyncio.create_task(
            asyncio.to_thread(ffmpeg_connect_once, f"{server.base}/whip/long", args.long_push)
        )
        while not push.done():
            sample = {"t_s": round(time.monotonic() - started, 1), **proc_status(server.pid)}
            samples.append(sample)
            log(f"long push: {sample}")
            await asyncio.wait({push}, timeout=10)
        result = push.result()
    finally:
        server.shutdown()
    runs = await asyncio.to_thread(read_timeline, data_dir)
    (run,) = runs.values() if len(runs) == 1 else ({},)
    lived_s = None
    if run.get("closed_ts_ms") and run.get("created_ts_ms"):
        lived_s = round((run["closed_ts_ms"] - run["created_ts_ms"]) / 1000, 1)
    return {
        "long_push": {
            "requested_s": args.long_push,
            "publisher": {k: v for k, v in result.items() if k != "ffmpeg_log"},
            "server_connected_ms": run.get("connected_ms"),
            "close_reason": run.get("closed_reason"),
            "session_lived_s": lived_s,
            "never_cut": run.get("closed_reason") == "deleted"
            and lived_s is not None
            and lived_s >= args.long_push - 2,
            "server_samples": samples,
            "server_stop": server.stop,
            "server_log_problems": server.problems(first=20),
        }
    }


async def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    if args.long_push > 0:
        return await long_push(args, base)
    restrict_host_addresses([HOST])  # aioice skips 127.0.0.1 by default
    data_dir = base / "data"
    server = start_server(data_dir, base / "server.log", max(1000, *args.levels))
    doc: dict[str, Any] = {}
    levels: list[dict[str, Any]] = []
    aiortc_runs: list[dict[str, Any]] = []
    ffmpeg_runs: list[dict[str, Any]] = []
    doc["host_load_at_start"] = host_load()
    try:
        await server.wait_ready()
        doc["server"] = {
            "cmd": [Path(server.cmd[0]).name, *server.cmd[1:]],
            "pid": server.pid,
            "env_overrides": server.env_overrides,
            "data_dir_fs": fs_type(data_dir),
            "ready_after_s": server.ready_s,
            "at_start": proc_status(server.pid),
        }
        connector = aiohttp.TCPConnector(limit=max(args.levels) + 8)
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            if not args.skip_post:
                for concurrency in args.levels:
                    levels.append(await post_level(http, server, concurrency, args.requests))
            if not args.skip_connect:
                for index in range(args.repetitions):
                    result = await aiortc_connect_once(http, server, index, args.push_seconds)
                    log(f"aiortc #{index}: {result.get('ms')} {result.get('error', '')}")
                    aiortc_runs.append(result)
                    await asyncio.sleep(0.2)
                    result["server_rss_kib_after"] = proc_status(server.pid).get("vmrss_kib")
                for index in range(args.repetitions):
                    url = f"{server.base}/whip/ffmpeg-{index}"
                    result = await asyncio.to_thread(ffmpeg_connect_once, url, args.push_seconds)
                    log(f"ffmpeg #{index}: {result.get('ms')} {result.get('error', '')}")
                    ffmpeg_runs.append(result)
                    await asyncio.sleep(0.2)
                    result["server_rss_kib_after"] = proc_status(server.pid).get("vmrss_kib")
        doc["server"]["at_end"] = proc_status(server.pid)
        doc["host_load_at_end"] = host_load()
    finally:
        server.shutdown()
    doc["server"]["stop"] = server.stop
    doc["server"]["log_problems"] = server.problems(first=20)
    runs = await asyncio.to_thread(read_timeline, data_dir)
    by_stream = {info.get("stream"): info for info in runs.values()}
    annotate_levels(levels, handler_ms(server.log_path), runs)
    doc["post_201"] = {
        "method": (
            "client-side wall time per POST (send offer + read answer); aiortc audio+video "
            "offers prepared before timing; waves of `concurrency`, each wave's sessions "
            "DELETEd before the next wave; one untimed warm-up wave per level; percentiles "
            "interpolated between closest ranks"
        ),
        "levels": [level["summary"] for level in levels],
    }
    if not args.skip_connect:
        doc["connect"] = connect_section(aiortc_runs, ffmpeg_runs, runs, by_stream)
    return doc


def connect_section(
    aiortc_runs: list[dict[str, Any]],
    ffmpeg_runs: list[dict[str, Any]],
    runs: dict[str, dict[str, Any]],
    by_stream: dict[Any, dict[str, Any]],
) -> dict[str, Any]:
    for result in aiortc_runs:
        run = runs.get(result.get("run_id", ""), {})
        result["server_ms_since_post"] = run.get("connected_ms")
        result["server_first_frame_ms"] = run.get("first_frame_ms")
        result["server_closed_reason"] = run.get("closed_reason")
    for index, result in enumerate(ffmpeg_runs):
        run = by_stream.get(f"ffmpeg-{index}", {})
        result["server_ms_since_post"] = run.get("connected_ms")
        result["server_first_frame_ms"] = run.get("first_frame_ms")
        result["server_closed_reason"] = run.get("closed_reason")

    def stat(values: list[Any]) -> dict[str, Any]:
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        full = summary(numbers)
        return {k: full[k] for k in ("n", "p50", "min", "max") if k in full}

    def marks(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
        return stat([r.get("ms", {}).get(key) for r in results])

    def elapsed(key: str) -> dict[str, Any]:
        return stat([r.get("ffmpeg_elapsed_ms", {}).get(key) for r in ffmpeg_runs])

    return {
        "aiortc": {
            "repetitions": len(aiortc_runs),
            "server_rss_kib_after_each": [r.get("server_rss_kib_after") for r in aiortc_runs],
            "connected": sum(r.get("final_state") == "connected" for r in aiortc_runs),
            "answer_setup": sorted({s for r in aiortc_runs for s in r.get("answer_setup", [])}),
            "client_post_to_201_ms": marks(aiortc_runs, "201"),
            "client_post_to_ice_completed_ms": marks(aiortc_runs, "ice_completed"),
            "client_post_to_connected_ms": marks(aiortc_runs, "pc_connected"),
            "server_post_to_connected_ms": stat(
                [r.get("server_ms_since_post") for r in aiortc_runs]
            ),
            "close_reasons": dict(Counter(str(r.get("server_closed_reason")) for r in aiortc_runs)),
            "errors": [r["error"] for r in aiortc_runs if r.get("error")],
            "runs": aiortc_runs,
        },
        "ffmpeg_whip": {
            "repetitions": len(ffmpeg_runs),
            "server_rss_kib_after_each": [r.get("server_rss_kib_after") for r in ffmpeg_runs],
            "connected_server_side": sum(
                r.get("server_ms_since_post") is not None for r in ffmpeg_runs
            ),
            "client_open_to_first_mux_ms": marks(ffmpeg_runs, "first_mux_done"),
            "client_av_open_ms": marks(ffmpeg_runs, "opened"),
            "server_post_to_connected_ms": stat(
                [r.get("server_ms_since_post") for r in ffmpeg_runs]
            ),
            "ffmpeg_own_breakdown_ms": {key: elapsed(key) for key in FFMPEG_PHASES},
            "close_ms_after_push": stat(
                [
                    r["ms"]["closed"] - r["ms"]["pushed"]
                    for r in ffmpeg_runs
                    if "closed" in r.get("ms", {}) and "pushed" in r.get("ms", {})
                ]
            ),
            "close_reasons": dict(Counter(str(r.get("server_closed_reason")) for r in ffmpeg_runs)),
            "errors": [r["error"] for r in ffmpeg_runs if r.get("error")],
            "runs": ffmpeg_runs,
        },
        "first_decoded_frame": {
            "method": "server-side first_frame event: POST received -> first video frame "
            "decoded by the pipeline's worker thread",
            "aiortc_ms": stat([r.get("server_first_frame_ms") for r in aiortc_runs]),
            "ffmpeg_ms": stat([r.get("server_first_frame_ms") for r in ffmpeg_runs]),
        },
    }


def versions() -> dict[str, str]:
    import aiortc
    import av

    return {
        "python": platform.python_version(),
        "aiortc": aiortc.__version__,
        "aioice": getattr(aioice, "__version__", "?"),
        "av": av.__version__,
        "ffmpeg_in_av": str(av.ffmpeg_version_info),
        "aiohttp": aiohttp.__version__,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-whip-"))
    started = time.monotonic()
    doc: dict[str, Any] = {
        "bench": "whip",
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "args": {
            "quick": args.quick,
            "levels": args.levels,
            "requests": args.requests,
            "repetitions": args.repetitions,
            "push_seconds": args.push_seconds,
        },
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), **versions()},
    }
    try:
        doc |= asyncio.run(run(args, base))
    finally:
        doc["seconds"] = round(time.monotonic() - started, 1)
        if args.keep_data:
            log(f"data and server log kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
