#!/usr/bin/env python3
"""Soak: sessions opened and closed by the hundred; does the server return to its baseline?

Prints one JSON document on stdout (figures and pass/fail per check); progress goes to
stderr. Exit status 1 when a check fails.

The real server runs as a subprocess (``python -m whip serve`` semantics, on a free
127.0.0.1 port, a fresh ``--data-dir`` in a temp dir; its PID is recorded and only it
is ever signalled). It is started through a tiny bench-side wrapper (:data:`PROBE`)
that runs ``whip`` exactly like ``-m whip`` and adds one thing: on ``SIGUSR1`` it writes
a JSON probe to a file (after ``gc.collect()``): asyncio tasks by name, Python threads by
name, live instances of the session classes (``WhipSession``, ``RTCPeerConnection``,
``Supervisor``, ...), ``sys.getallocatedblocks()``. Nothing else in the server is
touched. The server runs with ``limits.reclaim_after_s = 2`` so a vanished peer is
reclaimed quickly.

Every session is a real aiortc publisher in this process (ICE host candidates on
127.0.0.1 only): a small generated video track (160x120, 30 fps, VP8/H.264 as the
server picks) plus aiortc's silent audio track, so both decode threads start. It POSTs,
connects, waits (long-polling ``GET /v1/runs/{id}/events``) until the server has
decoded a ``first_frame``, holds ``--hold-s`` more, and closes:

- by ``DELETE`` of its session URL (``session_closed`` reason ``deleted``), or
- every ``--vanish-every``-th session by vanishing: its outgoing datagrams are muted,
  then the peer is closed, so the server sees neither a DTLS close_notify nor consent
  answers nor media, and must reclaim it (reason ``peer_gone``) after ``reclaim_after_s``.

Phases, after a warm-up (``--warmup`` sessions in sequence, then one wave of ``--wave``
concurrent ones; every third one vanishes). The warm-up pays for what happens once:
lazy imports, codec tables, and the glibc malloc arenas the decode threads create the
first time that many run at once (see "RSS" below). The baseline is taken after it:

- A: ``--sessions`` sessions in sequence;
- B: ``--sessions`` sessions as waves of ``--wave`` concurrent ones.

The HTTP client never keeps a connection alive (``force_close``), so the server holds no
client sockets between requests. Readings come from ``/proc/<pid>`` (open fds by kind,
``Threads``, ``VmRSS``/``RssAnon``), ``GET /metrics`` and the probe; they are taken at the
baseline and after each phase once the server is quiet (no live session, then fds and
threads equal to the baseline or ``--settle-s`` spent), and once more after an extra
``--final-settle-s``. A background sampler records peaks every 0.5 s. After the run the
server is stopped with SIGINT and its WAL is read back: every run has exactly one
``session_closed`` with the expected reason, none has ``forced_shutdown`` or
``worker_fault``.

Tolerances (the ``checks`` list says each one's limit and figure):

- open fds and OS threads: exactly the baseline (no tolerance);
- asyncio tasks: exactly the baseline, and no request handler still in flight (aiohttp's
  per-connection tasks are counted apart: the fd count covers connections); the live
  instances of the session classes above: zero (after ``gc.collect()``);
- gauges ``sessions_live``, ``stream_slots_in_use``, ``media_budget_{bytes,threads}_
  reserved``, ``forced_shutdown_*_kept``, ``wal_queue_depth``: zero, and no per-session
  series left in ``/metrics``;
- Python heap (``sys.getallocatedblocks()`` after ``gc.collect()``): at most
  ``--blocks-per-run-tolerance`` (150) blocks kept per run created. By design each run
  keeps some state after its session closed, bounded by the configured caps: its run
  registry entry, its events in the warm tail (up to 1024 runs), a reclaimed-session
  tombstone (up to 1024, 10 min), its id in the deleted-run FIFO. Measured: 74-88
  blocks per run (tracemalloc: about 12 KiB per run while under the 1024 warm-run cap,
  all held by ``RunTail`` events, tombstones and the run index). A leaked session object
  graph is thousands of blocks.
- RSS after the settle: at most baseline + ``--rss-tolerance-mib`` (48 MiB). Why:
  (a) the bounded per-run state above, about 12 MiB at the warm-tail cap; (b) glibc
  keeps freed memory. Its arenas (up to 8 x cores; the decode threads use 15 on the
  2-core reference host, all created in the warm-up wave) give pages back only from the
  top of a heap, so after a wave of 50 sessions (about 0.9 MiB each while live) what
  stays resident depends on which chunks were freed last, not on what is still in use.
  Measured on the reference host (2 cores), two default runs, no trimming: baseline
  127 / 141 MiB; phase A flat (131-133 / 135-138 MiB over its 500 sessions); phase B
  wave ends at 145-151 / 148-182 MiB with no upward trend; after the final settle
  +6.7 / +15.5 MiB (a 200-session run: +0.6 MiB; ``--quick``: +10 to +13 MiB). 48 MiB
  covers (a) plus the largest swing seen (+47 MiB right after phase B, before the
  settle, in a run with extra trims) with margin, and still fails a leak of 48 KiB per
  session over 1000 sessions. That the swing is the allocator, not a
  leak: with ``--trim`` the probe calls ``malloc_trim(0)`` at every reading and the RSS
  after it is flat: 110-111 MiB through phase A, 112-120 MiB over the waves of B, +2.2
  MiB at the end (checked against ``--trimmed-tolerance-mib``, 24). With
  ``MALLOC_ARENA_MAX=2`` phase A stays within 0.2 MiB over 200 sessions, while phase B
  swings the same: fragmentation at the high-water mark, not the number of arenas.
  The per-reading figures (``rss.phase_*_trend``) and the least-squares slopes over each
  phase's second half are reported, not checked: at these sizes the allocator's swing
  is larger than any slope worth failing on.

Usage::

    .venv/bin/python bench/soak.py                 # 500 sequential + 10 waves of 50
    .venv/bin/python bench/soak.py --quick         # 40 sequential + 4 waves of 10
    .venv/bin/python bench/soak.py --sessions 200 --wave 25 --keep
    .venv/bin/python bench/soak.py --trim          # also RSS after malloc_trim(0)
    .venv/bin/python bench/soak.py --quick --tracemalloc   # where Python memory grew

``--tracemalloc`` traces the server's Python allocations from its start; every reading
then lists the 15 source lines whose live memory grew most since the baseline (the RSS
checks are skipped: tracemalloc's own tables sit in the same heap). It is how the
per-run figures above were attributed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import aiohttp  # noqa: E402
import av  # noqa: E402
from aiortc import RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack  # noqa: E402

from bench.support import server_process  # noqa: E402
from bench.support.metrics import metric_values  # noqa: E402
from whip.rtc.host_addresses import restrict_host_addresses  # noqa: E402
from whip.rtc.peer import new_peer_connection  # noqa: E402

HOST = server_process.HOST
CONNECT_TIMEOUT_S = 20.0
FIRST_FRAME_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 10.0
ZERO_GAUGES = (
    "whip_sessions_live",
    "whip_stream_slots_in_use",
    "whip_media_budget_bytes_reserved",
    "whip_media_budget_threads_reserved",
    "whip_forced_shutdown_bytes_kept",
    "whip_forced_shutdown_threads_kept",
    "whip_wal_queue_depth",
)
PER_SESSION_PREFIX = "whip_session_"
WATCHED_TYPES = (
    "WhipSession",
    "RTCPeerConnection",
    "RTCDtlsTransport",
    "RTCIceTransport",
    "RTCRtpReceiver",
    "Supervisor",
    "FrameIntake",
    "Analysis",
    "Liveness",
    "Connection",  # aioice.ice.Connection
)

PROBE = r"""
import asyncio, collections, ctypes, gc, json, os, re, runpy, signal, sys, threading
import tracemalloc
_OUT = os.environ["WHIP_SOAK_PROBE"]
_WATCH = set(os.environ["WHIP_SOAK_WATCH"].split(","))
_ID = re.compile(r"[-_ ](?:s_|r_)?[A-Za-z0-9_-]{16,}$|-\d+$|_\d+$| \(.*\)$")
_seq = [0]
_TRIM = bool(os.environ.get("WHIP_SOAK_TRIM"))
_first = []  # the baseline tracemalloc snapshot (taken when the bench left a mark file)
_TRACE_FILTER = [tracemalloc.Filter(False, tracemalloc.__file__)]
if os.environ.get("WHIP_SOAK_TRACEMALLOC"):
    tracemalloc.start(1)

def _name(text):
    return _ID.sub("", text or "?")

def _task_kind(task):
    coro = task.get_coro()
    what = getattr(coro, "__qualname__", type(coro).__name__)
    return what if task.get_name().startswith("Task-") else _name(task.get_name()) + ":" + what

def _probe(signum, frame):
    _seq[0] += 1
    out = {"seq": _seq[0]}
    try:
        gc.collect()
        try:
            tasks = asyncio.all_tasks()
        except RuntimeError:
            tasks = set()
        kinds = collections.Counter(_task_kind(t) for t in tasks)
        out["request_tasks"] = sum(n for k, n in kinds.items() if k.startswith("RequestHandler."))
        kinds = {k: n for k, n in kinds.items() if not k.startswith("RequestHandler.")}
        out["tasks"] = sum(kinds.values())
        out["tasks_by_name"] = dict(kinds)
        threads = threading.enumerate()
        out["threads"] = len(threads)
        out["threads_by_name"] = dict(collections.Counter(_name(t.name) for t in threads))
        counts = collections.Counter()
        objects = gc.get_objects()
        for obj in objects:
            name = type(obj).__name__
            if name in _WATCH:
                counts[name] += 1
        out["gc_objects"] = len(objects)
        del objects
        out["objects"] = {name: counts.get(name, 0) for name in sorted(_WATCH)}
        out["allocated_blocks"] = sys.getallocatedblocks()
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(_TRACE_FILTER)
            if os.path.exists(_OUT + ".mark") or not _first:
                _first[:] = [snapshot]
                os.remove(_OUT + ".mark") if os.path.exists(_OUT + ".mark") else None
            out["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
            out["traced_growth_top"] = [
                f"{stat.size_diff // 1024:+d} KiB {stat.count_diff:+d} blocks "
                f"{stat.traceback[0].filename.split('site-packages/')[-1]}:"
                f"{stat.traceback[0].lineno}"
                for stat in snapshot.compare_to(_first[0], "lineno")[:15]
            ]
    except Exception as exc:
        out["error"] = repr(exc)
    if _TRIM:  # last: give free heap back to the OS, so the next /proc reading is live memory
        out["malloc_trim"] = ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open(_OUT + ".tmp", "w") as sink:
        json.dump(out, sink)
    os.replace(_OUT + ".tmp", _OUT)

signal.signal(signal.SIGUSR1, _probe)
sys.argv = ["whip", *sys.argv[1:]]
runpy.run_module("whip", run_name="__main__", alter_sys=True)
"""


def log(message: str) -> None:
    server_process.log("bench/soak", message)


# ---------------------------------------------------------------- /proc readings


def proc_figures(pid: int) -> dict[str, Any]:
    """Open fds (total and by kind), OS threads, RSS of ``pid``."""
    kinds: Counter[str] = Counter()
    fd_dir = f"/proc/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed between listdir and readlink
        if target.startswith("socket:"):
            kinds["socket"] += 1
        elif target.startswith("pipe:"):
            kinds["pipe"] += 1
        elif target.startswith("anon_inode:"):
            kinds[target.removeprefix("anon_inode:").strip("[]")] += 1
        elif target.startswith("/dev/"):
            kinds["dev"] += 1
        else:
            kinds["file"] += 1
    status: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as sink:
        for line in sink:
            key, _, value = line.partition(":")
            if key in ("Threads", "VmRSS", "RssAnon", "RssFile", "VmHWM"):
                status[key] = int(value.split()[0])
    return {
        "arenas": malloc_arenas(pid),
        "fds": sum(kinds.values()),
        "fds_by_kind": dict(sorted(kinds.items())),
        "threads": status["Threads"],
        "rss_kib": status["VmRSS"],
        "rss_anon_kib": status.get("RssAnon", 0),
        "rss_file_kib": status.get("RssFile", 0),
        "hwm_kib": status.get("VmHWM", 0),
    }


def malloc_arenas(pid: int) -> int:
    """Estimated glibc malloc arenas besides the main one. Each such arena heap is an
    anonymous mapping of ``HEAP_MAX`` (64 MiB on 64-bit), aligned to it, reserved at once
    (used part ``rw-p``, the rest ``---p``): count the aligned anonymous regions whose
    contiguous parts end exactly one ``HEAP_MAX`` after their start."""
    heap_max = 64 << 20
    regions: list[tuple[int, int]] = []
    with open(f"/proc/{pid}/maps", encoding="ascii") as sink:
        for line in sink:
            fields = line.split()
            if len(fields) > 5:  # backed by a file, or [heap]/[stack]
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            regions.append((start, end))
    count = 0
    for index, (start, end) in enumerate(regions):
        if start % heap_max:
            continue
        while end - start < heap_max and index + 1 < len(regions):
            index += 1
            if regions[index][0] != end:
                break
            end = regions[index][1]
        count += int(end - start == heap_max)
    return count


# ---------------------------------------------------------------- the server process


class Server(server_process.ServerProcess):
    """The server subprocess, started through the PROBE wrapper (``-c PROBE`` runs
    ``whip`` exactly like ``-m whip``)."""

    def __init__(
        self,
        work: Path,
        reclaim_after_s: float,
        max_sessions: int,
        *,
        tracemalloc: bool = False,
        trim: bool = False,
    ) -> None:
        self.probe_path = work / "probe.json"
        self._probe_seq = 0
        probe_env = {
            "WHIP_SOAK_PROBE": str(self.probe_path),
            "WHIP_SOAK_WATCH": ",".join(WATCHED_TYPES),
        }
        if tracemalloc:
            probe_env["WHIP_SOAK_TRACEMALLOC"] = "1"
        if trim:
            probe_env["WHIP_SOAK_TRIM"] = "1"
        super().__init__(
            "bench/soak",
            work / "data",
            work / "server.log",
            max_sessions,
            {
                "WHIP_INGEST_LOG_LEVEL": "WARNING",
                "WHIP_INGEST_LIMITS_RECLAIM_AFTER_S": str(reclaim_after_s),
            },
            bench_env=probe_env,
            launcher=("-c", PROBE),
        )

    async def probe(self, *, mark_baseline: bool = False) -> dict[str, Any]:
        """Signal the server's probe and read its answer (bounded). ``mark_baseline``:
        with ``--tracemalloc``, later probes report growth against this one."""
        if mark_baseline:
            Path(f"{self.probe_path}.mark").touch()  # noqa: ASYNC240 (an empty local temp file)
        self._probe_seq += 1
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                reading: dict[str, Any] = json.loads(self.probe_path.read_text())
                if reading.get("seq") == self._probe_seq:
                    return reading
            await asyncio.sleep(0.05)
        return {"error": "no probe answer"}


# ---------------------------------------------------------------- publishers


class SmallVideoTrack(VideoStreamTrack):
    """aiortc's test video track at 160x120 (cheap to encode 50 at a time on 2 cores);
    the luma changes every frame so the encoder sends real inter frames."""

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame(width=160, height=120, format="yuv420p")
        luma = bytes([(pts // 3000) % 200 + 16]) * frame.planes[0].buffer_size
        frame.planes[0].update(luma)
        for plane in frame.planes[1:]:
            plane.update(b"\x80" * plane.buffer_size)
        frame.pts = pts
        frame.time_base = time_base
        return frame


def mute(pc: RTCPeerConnection) -> None:
    """Make ``pc`` vanish: nothing it sends reaches the wire any more (no RTCP BYE, no
    DTLS close_notify). Touches ``RTCIceTransport._send`` (the hook whip.rtc.dtls_kick
    also relies on); STUN answers stop when the peer closes its ICE sockets."""

    async def drop(data: bytes) -> None:
        return None

    for transceiver in pc.getTransceivers():
        transport = transceiver.sender.transport
        if transport is not None:
            transport.transport._send = drop


@dataclass
class SessionResult:
    index: int
    vanish: bool
    status: int = 0
    run_id: str = ""
    post_s: float = 0.0
    connect_s: float | None = None
    first_frame_s: float | None = None
    delete_status: int | None = None
    lifetime_s: float = 0.0
    error: str = ""


@dataclass
class Context:
    http: aiohttp.ClientSession
    base: str
    hold_s: float


async def wait_for_event(ctx: Context, run_id: str, etype: str, timeout_s: float) -> bool:
    """Long-poll the run's events until ``etype`` shows (bounded by ``timeout_s``)."""
    after = 0
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        url = (
            f"{ctx.base}/v1/runs/{run_id}/events?after={after}&limit=1000"
            f"&wait={min(5.0, max(0.1, remaining)):.1f}"
        )
        async with ctx.http.get(url) as response:
            if response.status != 200:
                return False
            items = (await response.json())["items"]
        for item in items:
            if item["type"] == etype:
                return True
            after = item["seq"]
    return False


async def one_session(ctx: Context, index: int, vanish: bool, stream_prefix: str) -> SessionResult:
    """POST, connect, first decoded frame, hold, then DELETE or vanish."""
    result = SessionResult(index, vanish)
    started = time.monotonic()
    pc = new_peer_connection()
    connected = asyncio.Event()

    @pc.on("connectionstatechange")
    def on_state() -> None:
        if pc.connectionState == "connected":
            connected.set()

    location = ""
    try:
        pc.addTransceiver(SmallVideoTrack(), direction="sendonly")
        pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        posted = time.monotonic()
        async with ctx.http.post(
            f"{ctx.base}/whip/{stream_prefix}{index}",
            data=pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp"},
        ) as response:
            result.status = response.status
            body = await response.text()
            if response.status == 201:
                location = urljoin(ctx.base + "/", response.headers["Location"])
                result.run_id = response.headers["X-Run-Id"]
        result.post_s = time.monotonic() - posted
        if result.status != 201:
            result.error = f"POST {result.status}: {body[:200]}"
            return result
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        try:
            await asyncio.wait_for(connected.wait(), CONNECT_TIMEOUT_S)
        except TimeoutError:
            result.error = f"not connected ({pc.connectionState})"
            return result
        result.connect_s = time.monotonic() - posted
        if await wait_for_event(ctx, result.run_id, "first_frame", FIRST_FRAME_TIMEOUT_S):
            result.first_frame_s = time.monotonic() - posted
        else:
            result.error = "no first_frame"
        await asyncio.sleep(ctx.hold_s)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if location and vanish and not result.error:
            mute(pc)
        elif location:  # also after a failure: no session is left behind on purpose
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with ctx.http.delete(location) as response:
                    result.delete_status = response.status
            if result.delete_status != 200 and not result.error:
                result.error = f"DELETE {result.delete_status}"
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pc.close(), 10)
        result.lifetime_s = time.monotonic() - started
    return result


# ---------------------------------------------------------------- readings and settling


@dataclass
class Sampler:
    """Peaks of the server's fds, threads and RSS, every ``every`` seconds."""

    pid: int
    every: float = 0.5
    peaks: dict[str, int] = field(default_factory=lambda: {"fds": 0, "threads": 0, "rss_kib": 0})

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, KeyError):
                figures = proc_figures(self.pid)
                for key in self.peaks:
                    self.peaks[key] = max(self.peaks[key], figures[key])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)


async def sessions_gone(http: aiohttp.ClientSession, base: str, timeout_s: float) -> bool:
    """Poll ``/metrics`` until no session is live (bounded); True if none is."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = await metric_values(http, base)
        if values.get("whip_sessions_live", 1) == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.25)


async def quiet(
    server: Server,
    http: aiohttp.ClientSession,
    baseline: dict[str, Any] | None,
    settle_s: float,
) -> dict[str, Any]:
    """Wait until no session is live and (with a baseline) fds and threads are back to
    it, or ``settle_s`` has passed; without a baseline, until fds and threads hold still
    for two seconds. Returns a full reading (proc, gauges, probe) and the time taken."""
    started = time.monotonic()
    deadline = started + settle_s
    await sessions_gone(http, server.base, settle_s)
    sessions_quiet_s = time.monotonic() - started
    stable_since = time.monotonic()
    last: tuple[int, int] | None = None
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        figures = proc_figures(server.pid)
        now = (figures["fds"], figures["threads"])
        if baseline is not None:
            if now == (baseline["proc"]["fds"], baseline["proc"]["threads"]):
                break
        else:
            if now != last:
                last, stable_since = now, time.monotonic()
            elif time.monotonic() - stable_since >= 2.0:
                break
    settled_s = time.monotonic() - started
    await asyncio.sleep(0.3)  # the last /metrics connection is closed by now
    proc = proc_figures(server.pid)
    values = await metric_values(http, server.base)
    for _ in range(20):  # bounded: until aiohttp has finished the /metrics request
        await asyncio.sleep(0.1)
        probe = await server.probe(mark_baseline=baseline is None)
        if probe.get("request_tasks", 0) == 0:
            break
    trimmed = "malloc_trim" in probe
    proc["rss_trimmed_kib"] = proc_figures(server.pid)["rss_kib"] if trimmed else None
    gauges = {name: values.get(name) for name in ZERO_GAUGES}
    per_session = sorted({k.split("{")[0] for k in values if k.startswith(PER_SESSION_PREFIX)})
    return {
        "proc": proc,
        "gauges": gauges,
        "per_session_series": per_session,
        "counters": {
            k: values.get(k)
            for k in (
                'whip_admissions_total{outcome="accepted"}',
                "whip_runs_created_total",
                "whip_frames_decoded_total",
                "whip_frames_dropped_total",
                "whip_decode_errors_total",
                "whip_worker_faults_total",
                "whip_forced_shutdowns_total",
                "whip_warm_runs",
            )
        },
        "probe": probe,
        "sessions_quiet_s": round(sessions_quiet_s, 2),
        "settled_s": round(settled_s, 2),
    }


# ---------------------------------------------------------------- phases


def summary(values: list[float], digits: int = 3) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), digits),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], digits),
        "max": round(ordered[-1], digits),
    }


def phase_figures(results: list[SessionResult], wall_s: float) -> dict[str, Any]:
    errors = Counter(r.error.split(":")[0] for r in results if r.error)
    return {
        "sessions": len(results),
        "vanished": sum(1 for r in results if r.vanish and not r.error),
        "deleted": sum(1 for r in results if r.delete_status == 200),
        "posts_201": sum(1 for r in results if r.status == 201),
        "connected": sum(1 for r in results if r.connect_s is not None),
        "first_frame": sum(1 for r in results if r.first_frame_s is not None),
        "errors": dict(errors),
        "error_examples": [r.error for r in results if r.error][:5],
        "post_s": summary([r.post_s for r in results if r.status == 201]),
        "connect_s": summary([r.connect_s for r in results if r.connect_s is not None]),
        "first_frame_s": summary([r.first_frame_s for r in results if r.first_frame_s is not None]),
        "session_lifetime_s": summary([r.lifetime_s for r in results]),
        "wall_s": round(wall_s, 1),
    }


def is_vanish(index: int, every: int) -> bool:
    return every > 0 and index % every == every - 1


async def trend_point(server: Server, after: int) -> dict[str, Any]:
    """A reading during a phase: /proc, then the probe (whose malloc_trim makes the
    second RSS reading the memory actually in use) and the Python heap blocks."""
    figures = proc_figures(server.pid)
    probe = await server.probe()
    return {
        "after_sessions": after,
        "fds": figures["fds"],
        "threads": figures["threads"],
        "rss_kib": figures["rss_kib"],
        "rss_trimmed_kib": proc_figures(server.pid)["rss_kib"] if "malloc_trim" in probe else None,
        "allocated_blocks": probe.get("allocated_blocks"),
        "arenas": figures["arenas"],
    }


def rss_text(point: dict[str, Any]) -> str:
    trimmed = point["rss_trimmed_kib"]
    return f"rss {point['rss_kib'] // 1024} MiB" + (
        f" ({trimmed // 1024} MiB after malloc_trim)" if trimmed is not None else ""
    )


async def sequential(
    ctx: Context, server: Server, count: int, every: int, prefix: str, step: int = 50
) -> tuple[list[SessionResult], list[dict[str, Any]]]:
    """``count`` sessions one after the other; a (not settled) reading every ``step``."""
    out = []
    trend: list[dict[str, Any]] = []
    for index in range(count):
        out.append(await one_session(ctx, index, is_vanish(index, every), prefix))
        if (index + 1) % step == 0 or index + 1 == count:
            trend.append(await trend_point(server, index + 1))
            log(f"{prefix}: {index + 1}/{count}, {rss_text(trend[-1])}")
    return out, trend


async def waves(
    ctx: Context, server: Server, count: int, wave: int, every: int, prefix: str, settle_s: float
) -> tuple[list[SessionResult], list[dict[str, Any]]]:
    """``count`` sessions in waves of ``wave`` concurrent ones. After each wave, once no
    session is live (the vanished ones reclaimed; bounded by ``settle_s``), a reading."""
    out: list[SessionResult] = []
    trend: list[dict[str, Any]] = []
    for first in range(0, count, wave):
        indexes = range(first, min(count, first + wave))
        out += await asyncio.gather(
            *(one_session(ctx, i, is_vanish(i, every), prefix) for i in indexes)
        )
        await sessions_gone(ctx.http, server.base, settle_s)
        trend.append(await trend_point(server, first + len(indexes)))
        log(f"{prefix}: wave {first // wave + 1} done, {rss_text(trend[-1])}")
    return out, trend


# ---------------------------------------------------------------- the WAL afterwards


def read_wal(data_dir: Path) -> dict[str, Any]:
    """Per-run lifecycle from the stopped server's timeline."""
    from registry.timeline import Timeline, TimelineConfig

    timeline = Timeline.open(TimelineConfig(data_dir))
    try:
        runs: dict[str, Counter[str]] = {}
        reasons: dict[str, str] = {}
        for view in timeline.runs.list_runs():
            types: Counter[str] = Counter()
            after = 0
            for _ in range(1000):  # bounded
                events = timeline.read_run_events(view.run_id, after, 1000)
                if not events:
                    break
                for event in events:
                    types[str(event.type)] += 1
                    if event.type == "session_closed":
                        reasons[view.run_id] = str(event.data.get("reason"))
                after = events[-1].seq
            runs[view.run_id] = types
        return {"runs": runs, "reasons": reasons}
    finally:
        timeline.close()


# ---------------------------------------------------------------- checks


def check(name: str, ok: bool, limit: str, figure: Any) -> dict[str, Any]:
    return {"check": name, "pass": bool(ok), "limit": limit, "figure": figure}


def reading_checks(label: str, reading: dict[str, Any], base: dict[str, Any]) -> list[Any]:
    proc, bproc = reading["proc"], base["proc"]
    probe, bprobe = reading["probe"], base["probe"]
    out = [
        check(f"{label}: fds", proc["fds"] == bproc["fds"], f"== {bproc['fds']}", proc["fds"]),
        check(
            f"{label}: threads",
            proc["threads"] == bproc["threads"],
            f"== {bproc['threads']}",
            proc["threads"],
        ),
        check(
            f"{label}: gauges zero",
            all(v == 0 for v in reading["gauges"].values()),
            "all 0",
            {k.removeprefix("whip_"): v for k, v in reading["gauges"].items()},
        ),
        check(
            f"{label}: no per-session series",
            not reading["per_session_series"],
            "none",
            reading["per_session_series"],
        ),
        check(
            f"{label}: asyncio tasks",
            probe.get("tasks") == bprobe.get("tasks") and not probe.get("request_tasks"),
            f"== {bprobe.get('tasks')}, no request in flight",
            {"tasks": probe.get("tasks"), "request_tasks": probe.get("request_tasks")},
        ),
        check(
            f"{label}: live session objects",
            "objects" in probe and not any(probe["objects"].values()),
            "all 0",
            {k: v for k, v in probe.get("objects", {}).items() if v} or probe.get("error", 0),
        ),
    ]
    return out


def second_half_slope(trend: list[dict[str, Any]], key: str = "rss_kib") -> float | None:
    """``key`` growth per session over the second half of ``trend`` (least squares)."""
    points = trend[len(trend) // 2 - (1 if len(trend) % 2 == 0 else 0) :]
    if len(points) < 2 or any(p.get(key) is None for p in points):
        return None
    xs = [float(p["after_sessions"]) for p in points]
    ys = [float(p[key]) for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, 2)


def rss_growth_kib(reading: dict[str, Any], base: dict[str, Any]) -> int:
    return int(reading["proc"]["rss_kib"] - base["proc"]["rss_kib"])


# ---------------------------------------------------------------- main


async def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    restrict_host_addresses([HOST])
    server = Server(
        work,
        args.reclaim_after_s,
        max(100, 2 * args.wave),
        tracemalloc=args.tracemalloc,
        trim=args.trim,
    )
    report: dict[str, Any] = {"bench": "soak", "server_pid": server.pid}
    started = time.monotonic()
    try:
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            report["ready_s"] = round(await server.wait_ready(), 2)
            ctx = Context(http, server.base, args.hold_s)

            log(f"warm-up: {args.warmup} sessions in sequence, then one wave of {args.wave}")
            warm, _ = await sequential(ctx, server, args.warmup, 3, "warm-seq-")
            await sessions_gone(http, server.base, args.settle_s)
            warm_sequential = proc_figures(server.pid)
            warm += (
                await waves(ctx, server, args.wave, args.wave, 3, "warm-wave-", args.settle_s)
            )[0]
            baseline = await quiet(server, http, None, args.settle_s)
            log(f"baseline: {baseline['proc']}")

            sampler = Sampler(server.pid)
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop), name="soak-sampler")

            log(f"phase A: {args.sessions} sequential")
            t0 = time.monotonic()
            results_a, trend_a = await sequential(
                ctx, server, args.sessions, args.vanish_every, "a-", max(1, args.sessions // 10)
            )
            wall_a = time.monotonic() - t0
            after_a = await quiet(server, http, baseline, args.settle_s)
            log(f"after A: {after_a['proc']} in {wall_a:.0f}s")

            log(f"phase B: {args.sessions} in waves of {args.wave}")
            t0 = time.monotonic()
            results_b, trend_b = await waves(
                ctx, server, args.sessions, args.wave, args.vanish_every, "b-", args.settle_s
            )
            wall_b = time.monotonic() - t0
            after_b = await quiet(server, http, baseline, args.settle_s)
            log(f"after B: {after_b['proc']} in {wall_b:.0f}s")

            stop.set()
            await sampling
            await asyncio.sleep(args.final_settle_s)
            final = await quiet(server, http, baseline, args.settle_s)
            log(f"final: {final['proc']}")
    finally:
        report["server_stop"] = server.shutdown()
    report["server_log_problems"] = server.problems(most_common=8)
    wal = read_wal(server.data_dir)

    # ---- checks
    checks: list[dict[str, Any]] = []
    all_results = warm + results_a + results_b
    for label, results in (("phase A", results_a), ("phase B", results_b)):
        failed = [r for r in results if r.error]
        checks.append(
            check(
                f"{label}: every session connected, decoded a first frame, closed",
                not failed,
                "0 failures",
                {
                    "failures": len(failed),
                    "examples": [f"#{r.index}: {r.error}" for r in failed][:3],
                },
            )
        )
    checks += reading_checks("after A", after_a, baseline)
    checks += reading_checks("after B", after_b, baseline)
    checks += reading_checks("final", final, baseline)
    tolerance_kib = args.rss_tolerance_mib * 1024
    growth = rss_growth_kib(final, baseline)
    trimmed = final["proc"]["rss_trimmed_kib"]
    trimmed_growth = None if trimmed is None else trimmed - baseline["proc"]["rss_trimmed_kib"]
    if args.tracemalloc:
        # tracemalloc's own tables grow with every live block, in the same heap: RSS
        # says nothing about the server then. The readings still carry the figures.
        report["notes"] = ["--tracemalloc: RSS checks skipped (tracemalloc's own memory)"]
    else:
        if trimmed_growth is not None:
            checks.append(
                check(
                    "final: RSS growth over baseline after malloc_trim (KiB)",
                    trimmed_growth <= args.trimmed_tolerance_mib * 1024,
                    f"<= {args.trimmed_tolerance_mib * 1024}",
                    trimmed_growth,
                )
            )
        checks.append(
            check(
                "final: RSS growth over baseline (KiB)",
                growth <= tolerance_kib,
                f"<= {tolerance_kib}",
                growth,
            )
        )
    runs_since_baseline = len(results_a) + len(results_b)
    blocks = final["probe"].get("allocated_blocks", 0) - baseline["probe"].get(
        "allocated_blocks", 0
    )
    blocks_per_run = round(blocks / max(1, runs_since_baseline), 1)
    checks.append(
        check(
            "final: Python heap blocks kept per run created",
            blocks_per_run <= args.blocks_per_run_tolerance,
            f"<= {args.blocks_per_run_tolerance}",
            blocks_per_run,
        )
    )
    created = {r.run_id: r for r in all_results if r.run_id}
    runs, reasons = wal["runs"], wal["reasons"]
    closed_once = [rid for rid in created if runs.get(rid, Counter())["session_closed"] == 1]
    wrong_reason = [
        (rid, reasons.get(rid))
        for rid, r in created.items()
        if not r.error and reasons.get(rid) != ("peer_gone" if r.vanish else "deleted")
    ]
    faults = {
        etype: sum(t[etype] for t in runs.values()) for etype in ("forced_shutdown", "worker_fault")
    }
    checks.append(
        check(
            "WAL: every run has exactly one session_closed",
            len(closed_once) == len(created),
            f"{len(created)} runs",
            len(closed_once),
        )
    )
    checks.append(
        check(
            "WAL: close reasons (deleted / peer_gone as the publisher closed)",
            not wrong_reason,
            "0 wrong",
            {"wrong": len(wrong_reason), "examples": wrong_reason[:3]},
        )
    )
    checks.append(
        check("WAL: no forced_shutdown or worker_fault", not any(faults.values()), "0", faults)
    )
    checks.append(
        check(
            "server stopped cleanly on SIGINT",
            report["server_stop"].get("exit_code") == 0 and not report["server_stop"].get("killed"),
            "exit 0",
            report["server_stop"],
        )
    )

    def compact(reading: dict[str, Any]) -> dict[str, Any]:
        probe = reading["probe"]
        return {
            **reading["proc"],
            "gauges": {k.removeprefix("whip_"): v for k, v in reading["gauges"].items()},
            "counters": reading["counters"],
            "tasks": probe.get("tasks"),
            "request_tasks": probe.get("request_tasks"),
            "tasks_by_name": probe.get("tasks_by_name"),
            "py_threads_by_name": probe.get("threads_by_name"),
            "gc_objects": probe.get("gc_objects"),
            "allocated_blocks": probe.get("allocated_blocks"),
            **{k: probe[k] for k in ("traced_kib", "traced_growth_top") if k in probe},
            "live_objects": probe.get("objects"),
            "sessions_quiet_s": reading["sessions_quiet_s"],
            "settled_s": reading["settled_s"],
        }

    report.update(
        {
            "passed": all(c["pass"] for c in checks),
            "config": {
                "sessions_per_phase": args.sessions,
                "wave": args.wave,
                "warmup": args.warmup,
                "hold_s": args.hold_s,
                "vanish_every": args.vanish_every,
                "reclaim_after_s": args.reclaim_after_s,
                "settle_s": args.settle_s,
                "tracemalloc": args.tracemalloc,
                "malloc_trim_at_readings": args.trim,
                "final_settle_s": args.final_settle_s,
                "server_env": server.env_overrides,
                "publisher": "aiortc in this process: 160x120 video @30 fps + silent audio",
            },
            "tolerances": {
                "fds": "== baseline",
                "threads": "== baseline",
                "asyncio_tasks": "== baseline",
                "gauges": "0",
                "rss_growth_mib": args.rss_tolerance_mib,
                "rss_growth_after_malloc_trim_mib": args.trimmed_tolerance_mib,
                "python_blocks_per_run": args.blocks_per_run_tolerance,
            },
            "checks": checks,
            "phases": {
                "A": phase_figures(results_a, wall_a),
                "B": phase_figures(results_b, wall_b),
            },
            "readings": {
                "baseline": compact(baseline),
                "after_A": compact(after_a),
                "after_B": compact(after_b),
                "final": compact(final),
            },
            "rss": {
                "baseline_mib": round(baseline["proc"]["rss_kib"] / 1024, 1),
                "after_A_mib": round(after_a["proc"]["rss_kib"] / 1024, 1),
                "after_B_mib": round(after_b["proc"]["rss_kib"] / 1024, 1),
                "final_mib": round(final["proc"]["rss_kib"] / 1024, 1),
                "after_warmup_sequential_mib": round(warm_sequential["rss_kib"] / 1024, 1),
                "growth_A_mib": round(rss_growth_kib(after_a, baseline) / 1024, 1),
                "growth_B_mib": round(rss_growth_kib(after_b, baseline) / 1024, 1),
                "growth_final_mib": round(growth / 1024, 1),
                "after_malloc_trim_mib": {
                    name: None
                    if reading["proc"]["rss_trimmed_kib"] is None
                    else round(reading["proc"]["rss_trimmed_kib"] / 1024, 1)
                    for name, reading in (
                        ("baseline", baseline),
                        ("after_A", after_a),
                        ("after_B", after_b),
                        ("final", final),
                    )
                },
                "peak_mib": round(sampler.peaks["rss_kib"] / 1024, 1),
                "arenas": {
                    "after_warmup_sequential": warm_sequential["arenas"],
                    "baseline": baseline["proc"]["arenas"],
                    "final": final["proc"]["arenas"],
                },
                "slope_kib_per_session_second_half": {
                    "A": second_half_slope(trend_a),
                    "B": second_half_slope(trend_b),
                    "A_after_malloc_trim": second_half_slope(trend_a, "rss_trimmed_kib"),
                    "B_after_malloc_trim": second_half_slope(trend_b, "rss_trimmed_kib"),
                    "A_python_blocks": second_half_slope(trend_a, "allocated_blocks"),
                    "B_python_blocks": second_half_slope(trend_b, "allocated_blocks"),
                },
                "phase_A_trend": trend_a,
                "phase_B_trend": trend_b,
            },
            "peaks": sampler.peaks,
            "wal": {
                "runs": len(runs),
                "close_reasons": dict(Counter(reasons.values())),
                "events_per_run": summary([float(sum(t.values())) for t in runs.values()], 1),
            },
            "host": {"cpus": len(os.sched_getaffinity(0)), "pyav": av.__version__},
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=500, help="sessions per phase")
    parser.add_argument("--wave", type=int, default=50, help="concurrent sessions in phase B")
    parser.add_argument(
        "--warmup", type=int, default=6, help="sequential warm-up sessions (then one wave)"
    )
    parser.add_argument("--quick", action="store_true", help="40 sessions, waves of 10")
    parser.add_argument("--hold-s", type=float, default=0.3, help="after the first frame")
    parser.add_argument("--vanish-every", type=int, default=10, help="0: every session DELETEs")
    parser.add_argument("--reclaim-after-s", type=float, default=2.0)
    parser.add_argument("--settle-s", type=float, default=20.0)
    parser.add_argument("--final-settle-s", type=float, default=5.0)
    parser.add_argument("--rss-tolerance-mib", type=int, default=48)
    parser.add_argument("--trimmed-tolerance-mib", type=int, default=24)
    parser.add_argument("--blocks-per-run-tolerance", type=float, default=150.0)
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace Python allocations in the server (slower); readings list the top growth",
    )
    parser.add_argument(
        "--trim",
        action="store_true",
        help="call malloc_trim(0) in the server at every reading (RSS then ~ memory in use)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (log, data)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.wave, args.warmup = 40, 10, 4
        args.final_settle_s = 2.0
    work = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    log(f"work dir {work}")
    report: dict[str, Any] = {}
    try:
        report = asyncio.run(soak(args, work))
    finally:
        keep = args.keep or not report.get("passed", False)
        if not keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    report["work_dir"] = str(work) if keep else None
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if report.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
