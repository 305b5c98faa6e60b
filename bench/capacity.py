#!/usr/bin/env python3
"""Capacity: how many concurrent FFmpeg WHIP publishers the real server keeps up with.

Prints one JSON document on stdout; progress goes to stderr.

For each (resolution, decode policy) the server is started fresh (``python -m whip
serve`` on a free loopback port, fresh ``--data-dir``, high limits, the policy in
``WHIP_INGEST_PIPELINE_DECODE``), then N publishers start together, each its own
``python -c`` subprocess: FFmpeg's WHIP muxer through PyAV in stream-copy mode (the
pre-encoded mp4's packets muxed into ``av.open(url, "w", format="whip")``, paced by pts,
looping) for ``--push-s`` seconds. Each publisher reports the video frames it sent and
its own CPU time (getrusage, all its threads). While they push, ``GET /v1/sessions`` is
polled every 3 s (RTP packets received / lost per session: aiortc's receiver stats;
``rtp_stats_age_s`` says how long before the end of the push the last reading that
answered was taken: an overloaded server answers late or not at all) and the
server's CPU is read from ``/proc/<pid>/stat``. After the publishers have closed (FFmpeg
DELETEs its session, so the server writes the final ``stats`` event) the server is
stopped with SIGINT and the timeline is opened to read each run's final stats
(frames_in, frames_decoded, frames_dropped, keyframes_decoded).

A step passes when every session has RTP loss <= 1 % and decoded
>= 99 % of what was sent: every frame with ``decode=all``; every keyframe sent with
``decode=keyframes`` (that policy decodes one frame per GOP, so its criterion is also
frames_in >= 99 % of frames sent). Intake drops are reported, not a criterion of
their own (a dropped frame is not decoded, so the 99 % rule covers them). N steps up
until a step fails.

Everything runs on one host (publishers and server share its CPUs: see ``host.cpus``).
Clips: libx264 baseline, no B-frames, GOP 30, 30 fps, 10 s, synthetic motion, made in a
temp dir at start.

The ICE sockets (``--udp-mux``, default ``both``): each N runs twice back to back, on
the shared UDP port (``ice.udp_mux = true``, the default; configurations named as in
``CONFIGS``) and with a socket per session (``ice.udp_mux = false``; named
``<config>:nomux``). ``mux_comparison`` sets them side by side: per configuration the
largest passing N of each, and at every N both ran, the server CPU per session with the
mux over without it (target: at most 1.05; ``bench/support/udp_mux_compare.py``).

The publisher's codec (``--codecs``, default ``ffmpeg``): ``ffmpeg`` is FFmpeg's WHIP
muxer with the H.264 clip (above); ``h264``, ``h265``, ``av1`` and ``vp9`` are OBS-shaped
libdatachannel publishers (``bench/support/obs_push.py``: OBS's offer, libdatachannel's
packetizers, Opus silence beside the video) replaying the same clip re-encoded once at
start with the encoder OBS-shaped tests use (libx264 / libx265 / libsvtav1 /
libvpx-vp9 realtime without alt-ref frames, GOP 30, no B-frames, the resolution's
bitrate), so every codec decodes the same pictures; configurations are then named
``<config>:<codec>`` (``<config>:<codec>:nomux`` without the mux). libdatachannel has no
VP9 packetizer: VP9's RTP packets (RFC 9628, non-flexible mode with a 15-bit picture id
and the scalability structure on key frames, as libwebrtc writes them) come from
``bench/support/vp9_rtp.py`` and go out through the track's sender reporter and NACK
responder. ``codec_comparison`` sets the codecs side by side: per configuration the
largest passing N and, at every N, the server CPU per session.

Simulcast (``--codecs simulcast``, 720p configurations only; named
``<config>:simulcast``): OBS-shaped 3-layer H.264 publishers
(``bench/support/obs_simulcast.py``: one video m-line, RIDs ``0``..``2``, no video
``a=ssrc``) replaying the clip encoded once per layer at start (320x180 at 300 kb/s,
640x360 at 800 kb/s, 1280x720 at 2.5 Mb/s; libx264 as ``h264``'s plus
``profile=baseline``, GOP 30), against a server with ``pipeline.simulcast = highest``
(``WHIP_INGEST_PIPELINE_SIMULCAST``). Its step passes on the decoded layer's figures, not
a sum of layers: RTP loss <= 1 % (aiortc's receiver only sees the decoded layer), the
final ``stats`` event's ``layers`` name exactly one decoded layer, the highest (by
picture size), the only one the server ever chose (``simulcast_layer`` events
``layer_decoded``), with its own ``frames_in`` >= 99 % of the frames sent per layer, and
``frames_decoded`` >= 99 % of them. ``simulcast_comparison`` sets it beside the
single-layer ``h264`` publisher (the same 720p stream alone): each's largest passing N
and, at every N both ran, the server CPU per session of each and their ratio. Run both
in one sweep: ``--codecs h264,simulcast``.

Memory per session (``--memory``, instead of the sweep): for each N of ``--steps``
(default 4, 8), twice on a fresh server: N *idle* sessions (aiortc publishers in one
process, a video track that never sends a frame: connected, consent-checked, no media)
and N sessions *pushing* the 720p30 clip. The server's RSS (VmRSS) is read at rest,
after one warm-up session of the same kind opened and closed (one-time costs), with the
N sessions (idle: median over 3 s; push: median of samples from 4 s after all connected
to 2 s before the end, and the max), and after they closed. Per session: (with N - at
rest) / N; marginal: the slope between the smallest and the largest N. The media
permit each session reserves (``/metrics``) is reported beside it: the reservation
bounds the queued payload, not the decoder's frames or aiortc's state.

Usage::

    .venv/bin/python bench/capacity.py            # full sweep (about 10-15 min)
    .venv/bin/python bench/capacity.py --memory --memory-repeats 3   # about 8 min
    .venv/bin/python bench/capacity.py --quick    # one small step per configuration
    .venv/bin/python bench/capacity.py --only 720p:keyframes --steps 16,24,32
    .venv/bin/python bench/capacity.py --only 720p:all --codecs h264,h265,av1,vp9 --udp-mux on
    .venv/bin/python bench/capacity.py --only 720p:all --codecs h264,simulcast --udp-mux on
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import aiohttp  # noqa: E402

from bench.support import server_process  # noqa: E402
from bench.support.udp_mux_compare import compare_udp_mux  # noqa: E402
from whip.webhooks.child_priority import reset_to_normal_policy  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

CONFIGS = {
    "720p:all": ("720p", "all", [4, 8, 12, 16, 24]),
    "720p:keyframes": ("720p", "keyframes", [8, 16, 24, 32]),
    "360p:all": ("360p", "all", [12, 24, 36, 48]),
    "360p:keyframes": ("360p", "keyframes", [24, 36, 48]),
}
SIZES = {"720p": (1280, 720, 2_500_000), "360p": (640, 360, 800_000)}
CODECS = ("ffmpeg", "h264", "h265", "av1", "vp9", "simulcast")
OBS_PUSH = REPO / "bench" / "support" / "obs_push.py"


def log(message: str) -> None:
    server_process.log("bench/capacity", message)


# ---------------------------------------------------------------- the publisher

PUBLISHER = r"""
import json, resource, sys, time
import av
url, clip, push_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = {"frames_sent": 0, "keyframes_sent": 0, "loops": 0}
t0 = time.monotonic()
try:
    src = av.open(clip)
    vin = src.streams.video[0]
    tb = vin.time_base
    packets = [p for p in src.demux(vin) if p.size > 0]
    base_pts = min(p.pts for p in packets)
    span = max(p.pts for p in packets) - base_pts + (packets[1].duration or 1)
    dst = av.open(url, "w", format="whip", options={"handshake_timeout": "10000"})
    vout = dst.add_stream_from_template(vin)
    started = None
    loop = 0
    try:
        while True:
            for p in packets:
                offset = loop * span
                due_s = float((p.pts - base_pts + offset) * tb)
                if started is not None:
                    if due_s >= push_s:
                        raise StopIteration
                    delay = started + due_s - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                q = av.Packet(bytes(p))
                q.pts = p.pts - base_pts + offset
                q.dts = (p.dts if p.dts is not None else p.pts) - base_pts + offset
                q.duration = p.duration
                q.time_base = tb
                q.is_keyframe = p.is_keyframe
                q.stream = vout
                dst.mux(q)
                if started is None:
                    started = time.monotonic()
                    out["connect_s"] = round(started - t0, 3)
                out["frames_sent"] += 1
                out["keyframes_sent"] += int(p.is_keyframe)
            loop += 1
            out["loops"] = loop
    except StopIteration:
        pass
    finally:
        out["push_s"] = round(time.monotonic() - (started or t0), 3)
        dst.close()
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:300]
ru = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_s"] = round(ru.ru_utime + ru.ru_stime, 3)
out["wall_s"] = round(time.monotonic() - t0, 3)
print(json.dumps(out), flush=True)
"""


IDLE_PUBLISHERS = r"""
import asyncio, json, sys
import aiohttp
from aiortc import MediaStreamTrack, RTCSessionDescription
from whip.rtc.host_addresses import restrict_host_addresses
from whip.rtc.peer import new_peer_connection
restrict_host_addresses(["127.0.0.1"])
base, n, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class Silent(MediaStreamTrack):
    # A connected video publisher that never produces a frame (a paused camera).
    kind = "video"
    async def recv(self):
        await asyncio.Event().wait()

async def one(http, i):
    pc = new_peer_connection()
    pc.addTransceiver(Silent(), direction="sendonly")
    done = asyncio.Event()
    settled = ("connected", "failed", "closed")
    pc.on("connectionstatechange", lambda: pc.connectionState in settled and done.set())
    await pc.setLocalDescription(await pc.createOffer())
    url, offer = f"{base}/whip/{prefix}{i:03d}", pc.localDescription.sdp
    async with http.post(url, data=offer, headers={"Content-Type": "application/sdp"}) as r:
        answer, status, location = await r.text(), r.status, r.headers.get("Location", "")
    if status != 201:
        return pc, "", f"POST {status}"
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    try:
        await asyncio.wait_for(done.wait(), 30)
    except asyncio.TimeoutError:
        pass
    return pc, location, pc.connectionState

async def main():
    async with aiohttp.ClientSession() as http:
        peers = await asyncio.gather(*(one(http, i) for i in range(n)))
        print(json.dumps({"states": [state for _, _, state in peers]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
        for pc, location, _ in peers:
            if location:
                async with http.delete(base + location) as r:
                    await r.read()
            await pc.close()
    print(json.dumps({"closed": n}), flush=True)

asyncio.run(main())
"""
"""``n`` aiortc publishers in one process, each a video track that sends nothing: they
connect (ICE, DTLS; consent checks keep them alive) and stay idle until stdin closes,
then DELETE their sessions."""


# ---------------------------------------------------------------- clips


def make_clip(path: Path, width: int, height: int, bitrate: int, seconds: float) -> None:
    import av
    import numpy as np

    fps = 30
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        ctx = stream.codec_context
        ctx.gop_size = 30
        ctx.max_b_frames = 0
        ctx.bit_rate = bitrate
        ctx.time_base = fractions.Fraction(1, fps)
        ctx.options = {
            "preset": "veryfast",
            "profile": "baseline",
            "tune": "zerolatency",
            "sc_threshold": "0",
            "keyint_min": "30",
        }
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        box = height // 4
        for index in range(int(seconds * fps)):
            t = index / fps
            r = 128 + 100 * np.sin(x / 37.0 + t * 2.0)
            g = 128 + 100 * np.sin(y / 23.0 - t * 1.3)
            b = 128 + 100 * np.sin((x + y) / 51.0 + t * 0.7)
            image = np.stack([r, g, b], axis=2)
            cx = int((index * 8) % (width - box))
            image[box : 2 * box, cx : cx + box] = (240, 240, 240)
            frame = av.VideoFrame.from_ndarray(image.astype(np.uint8), format="rgb24")
            frame.pts = index
            for packet in stream.encode(frame.reformat(format="yuv420p")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def encode_frames(
    clip: Path,
    codec: str,
    bitrate: int,
    path: Path,
    size: tuple[int, int] | None = None,
    extra: dict[str, str] | None = None,
) -> int:
    """Re-encode ``clip``'s pictures with the OBS-shaped publisher's ``codec`` encoder into
    a frames file (:func:`bench.support.obs_like.save_frames`), scaled to ``size`` if
    given, with ``extra`` encoder options; returns the frame count."""
    import av

    from bench.support.obs_like import ENCODERS, EncodedFrame, save_frames

    name, options = ENCODERS[codec]  # type: ignore[index]
    options = {**options, **(extra or {})}

    def frames() -> Any:
        with av.open(str(clip)) as source:
            stream = source.streams.video[0]
            encoder = av.CodecContext.create(name, "w")
            encoder.width, encoder.height = size or (stream.width, stream.height)
            encoder.pix_fmt = "yuv420p"
            encoder.time_base = fractions.Fraction(1, 30)
            encoder.framerate = fractions.Fraction(30, 1)
            encoder.gop_size = 30
            encoder.bit_rate = bitrate
            encoder.options = dict(options)
            if codec == "av1":  # SVT-AV1 holds a bitrate in low delay only with CBR
                encoder.options = {**options, "svtav1-params": f"{options['svtav1-params']}:rc=2"}
            if codec == "vp9":  # CBR, as a real-time sender runs libvpx
                encoder.options = {**options, "minrate": str(bitrate), "maxrate": str(bitrate)}
            encoder.open()
            reset_to_normal_policy()  # libsvtav1 opened as root: SCHED_FIFO 99 otherwise
            for index, picture in enumerate(source.decode(stream)):
                picture = picture.reformat(encoder.width, encoder.height, "yuv420p")
                picture.pts = index
                picture.time_base = encoder.time_base  # else PyAV rescales from the mp4's
                yield from encoder.encode(picture)
            yield from encoder.encode(None)

    encoded: list[EncodedFrame] = [(int(p.pts), bytes(p), p.is_keyframe) for p in frames()]
    if not encoded or not encoded[0][2]:
        raise RuntimeError(f"{codec}: the re-encoded clip does not start with a keyframe")
    return save_frames(path, encoded)


SIMULCAST_OPTIONS = {"profile": "baseline"}
"""libx264 options of the simulcast layers beside the single-layer ``h264`` publisher's
(``ultrafast`` already leaves out CABAC and B-frames: the same stream, labelled)."""


def encode_layers(clip: Path, work: Path, res: str) -> str:
    """The ``simulcast`` publisher's frames files: ``clip`` encoded once per layer of
    :data:`bench.support.obs_simulcast.REPLAY_LAYERS` (H.264, GOP 30, each layer's
    bitrate), lowest first; returns their paths joined by commas (``obs_push.py``)."""
    from bench.support.obs_simulcast import REPLAY_LAYERS

    paths = []
    for rid, (width, height, bitrate) in enumerate(REPLAY_LAYERS):
        path = work / f"clip_{res}.simulcast.{rid}.frames"
        count = encode_frames(clip, "h264", bitrate, path, (width, height), SIMULCAST_OPTIONS)
        log(f"clip {path.name}: {count} frames at {width}x{height}, {path.stat().st_size} bytes")
        paths.append(str(path))
    return ",".join(paths)


# ---------------------------------------------------------------- processes


def cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` (all threads), seconds."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        parts = [int(v) for v in stat.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def rss_kib(pid: int) -> int | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def start_server(
    data_dir: Path,
    log_path: Path,
    sessions: int,
    decode: str,
    udp_mux: bool = True,
    simulcast: str | None = None,
) -> server_process.ServerProcess:
    """A fresh server with room for ``sessions`` (+ 8), the ``decode`` policy, the ICE
    sockets (the shared UDP port, a free one, or a socket per session) and, if given,
    the ``simulcast`` layer policy (``pipeline.simulcast``)."""
    log(f"server for {sessions} sessions, decode={decode}, udp_mux={udp_mux}")
    layers = {} if simulcast is None else {"WHIP_INGEST_PIPELINE_SIMULCAST": simulcast}
    return server_process.ServerProcess(
        "bench/capacity",
        data_dir,
        log_path,
        sessions + 8,
        {
            **server_process.media_budget_env(sessions + 8),
            "WHIP_INGEST_PIPELINE_DECODE": decode,
            "WHIP_INGEST_ICE_UDP_MUX": "true" if udp_mux else "false",
            "WHIP_INGEST_LOG_LEVEL": "INFO",
            **layers,
        },
    )


def read_final_stats(data_dir: Path) -> dict[str, dict[str, Any]]:
    """stream -> final stats (and close reason) from the stopped server's timeline."""
    from registry.timeline import Timeline, TimelineConfig

    timeline = Timeline.open(TimelineConfig(data_dir))
    try:
        out: dict[str, dict[str, Any]] = {}
        for view in timeline.runs.list_runs():
            info: dict[str, Any] = {"run_id": view.run_id, "stats_events": 0}
            after = 0
            for _ in range(1000):
                events = timeline.read_run_events(view.run_id, after, 1000)
                if not events:
                    break
                for event in events:
                    if event.type == "run_created":
                        info["stream"] = event.data.get("stream", "")
                    elif event.type == "stats":
                        info["stats_events"] += 1
                        video = event.data.get("kind", "video") == "video"
                        if event.data.get("final") and video:  # the audio track's too
                            info["final"] = dict(event.data)
                    elif event.type == "simulcast_layer":
                        info.setdefault("layer_changes", []).append(dict(event.data))
                    elif event.type == "session_closed":
                        info["closed_reason"] = event.data.get("reason")
                    elif event.type == "forced_shutdown":
                        info["forced_shutdown"] = True
                after = events[-1].seq
            out[info.get("stream", view.run_id)] = info
        return out
    finally:
        timeline.close()


# ---------------------------------------------------------------- one step


async def poll_sessions(
    http: aiohttp.ClientSession, base: str, server_pid: int, stop: asyncio.Event, every: float
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Poll GET /v1/sessions: stream -> last reading; plus server CPU samples."""
    last: dict[str, dict[str, Any]] = {}
    samples: list[dict[str, Any]] = []
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            break
        samples.append({"t": time.monotonic(), "cpu_s": cpu_s(server_pid)})
        with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            async with http.get(f"{base}/v1/sessions", timeout=aiohttp.ClientTimeout(5)) as r:
                body = await r.json()
            items = (
                body.get("sessions", body.get("items", body)) if isinstance(body, dict) else body
            )
            now = time.monotonic()
            for item in items or []:
                if isinstance(item, dict) and "stream" in item:
                    last[item["stream"]] = {"read_at": now} | {
                        k: item.get(k)
                        for k in ("id", "run_id", "packets_received", "packets_lost", "jitter_ms",
                                  "drops", "queue_depth", "connected")
                    }  # fmt: skip
    return last, samples


def py_spy_dump(pid: int) -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        return None
    try:
        done = subprocess.run(
            [str(exe), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20
        )
        return (done.stdout or "") + (done.stderr or "")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc}"


def py_spy_record(pid: int, seconds: int, path: Path) -> subprocess.Popen[bytes] | None:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        return None
    return subprocess.Popen(
        [str(exe), "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "50",
         "--format", "raw", "--threads", "--nonblocking", "-o", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def summarize_raw(path: Path, top: int = 15) -> dict[str, Any]:
    """Self-time leaf functions and per-thread-kind totals from py-spy's raw format."""
    leaves: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_s = line.rpartition(" ")
            if not count_s.isdigit():
                continue
            count = int(count_s)
            total += count
            frames = stack.split(";")
            head = frames[0]
            kind = head.split("-s_")[0].split(" ")[0] if head.startswith("thread") else head
            kind = kind.replace('"', "")
            for prefix in ("decode-video", "decode-audio", "MainThread", "Dummy", "asyncio"):
                if prefix in head:
                    kind = prefix
                    break
            threads[kind] = threads.get(kind, 0) + count
            leaf = frames[-1]
            leaves[leaf] = leaves.get(leaf, 0) + count
    ordered = sorted(leaves.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return {
        "samples": total,
        "by_thread": dict(sorted(threads.items(), key=lambda kv: kv[1], reverse=True)[:10]),
        "top_leaf": [{"frame": k[:160], "pct": round(100 * v / total, 1)} for k, v in ordered]
        if total
        else [],
    }


async def run_step(
    args: argparse.Namespace,
    work: Path,
    res: str,
    decode: str,
    n: int,
    clip: Path | str,
    spy: bool,
    udp_mux: bool = True,
    codec: str = "ffmpeg",
) -> dict[str, Any]:
    tag = f"{res}-{decode}-{n}-{'mux' if udp_mux else 'nomux'}"
    if codec != "ffmpeg":
        tag = f"{res}-{decode}-{codec}-{n}-{'mux' if udp_mux else 'nomux'}"
    data_dir = work / f"data-{tag}"
    simulcast = "highest" if codec == "simulcast" else None
    server = start_server(data_dir, work / f"server-{tag}.log", n, decode, udp_mux, simulcast)
    pubs: list[subprocess.Popen[bytes]] = []
    step: dict[str, Any] = {
        "n": n,
        "resolution": res,
        "decode": decode,
        "udp_mux": udp_mux,
        "codec": codec,
    }
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_ready()
            cpu0, t0 = cpu_s(server.pid), time.monotonic()
            env = dict(os.environ)
            env["PYTHONPATH"] = ""
            for i in range(n):
                url = f"{server.base}/whip/cap{i:03d}"
                cmd = [sys.executable, "-c", PUBLISHER, url, str(clip), str(args.push_s)]
                if codec != "ffmpeg":
                    cmd = [sys.executable, str(OBS_PUSH), url, str(clip), str(args.push_s), codec]
                pub = subprocess.Popen(  # noqa: ASYNC220 (a fast fork/exec; PID recorded)
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    cwd=work,
                    env=env,
                )
                pubs.append(pub)
            log(f"{tag}: {n} publishers started (pids {pubs[0].pid}..{pubs[-1].pid})")
            stop = asyncio.Event()
            poller = asyncio.create_task(poll_sessions(http, server.base, server.pid, stop, 3.0))
            # steady-state window: after the connects (~3 s) until shortly before the end
            await asyncio.sleep(min(4.0, args.push_s / 4))
            win0 = (time.monotonic(), cpu_s(server.pid), host_cpu())
            pub_cpu0 = sum(cpu_s(p.pid) or 0.0 for p in pubs)
            spy_proc = None
            window = max(2.0, args.push_s - 8.0)
            if spy:
                spy_proc = py_spy_record(server.pid, int(window), work / f"spy-{tag}.raw")
            await asyncio.sleep(window)
            win1 = (time.monotonic(), cpu_s(server.pid), host_cpu())
            pub_cpu1 = sum(cpu_s(p.pid) or 0.0 for p in pubs)
            if spy and args.dump:
                step["py_spy_dump"] = (py_spy_dump(server.pid) or "")[:6000]
            push_end = t0 + args.push_s + 1.0  # publishers start within about a second
            results = await finish_pushers(pubs, args.push_s + 60)
            await asyncio.sleep(1.5)  # the DELETEs' session closes write the final stats
            stop.set()
            sessions, _samples = await poller
            cpu1, t1 = cpu_s(server.pid), time.monotonic()
            if spy_proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy_proc.wait(15)
                if spy_proc.poll() is None:
                    spy_proc.kill()
                    spy_proc.wait(5)
                step["py_spy"] = summarize_raw(work / f"spy-{tag}.raw")
            step["server_rss_kib_end"] = rss_kib(server.pid)
    finally:
        kill_pushers(pubs)
        step["server_stop"] = server.shutdown()
    step["server_log_problems"] = server.problems(first=5)
    finals = read_final_stats(data_dir)

    # ---- per-session figures
    per: list[dict[str, Any]] = []
    for i, pub in enumerate(results):
        stream = f"cap{i:03d}"
        final = finals.get(stream, {}).get("final", {})
        live = sessions.get(stream, {})
        recv, lost = live.get("packets_received"), live.get("packets_lost")
        stats_age = round(push_end - live["read_at"], 1) if "read_at" in live else None
        loss = None
        if recv is not None and lost is not None and recv + lost > 0:
            loss = lost / (recv + lost)
        sent = pub.get("frames_sent", 0)
        ksent = pub.get("keyframes_sent", 0)
        row = {
            "stream": stream,
            "sent": sent,
            "keyframes_sent": ksent,
            "frames_in": final.get("frames_in"),
            "frames_decoded": final.get("frames_decoded"),
            "keyframes_decoded": final.get("keyframes_decoded"),
            "frames_dropped": final.get("frames_dropped"),
            "decode_errors": final.get("decode_errors"),
            "packets_received": recv,
            "packets_lost": lost,
            "loss": None if loss is None else round(loss, 5),
            "rtp_stats_age_s": stats_age,
            "closed": finals.get(stream, {}).get("closed_reason"),
            "pub_cpu_s": pub.get("cpu_s"),
            "pub_connect_s": pub.get("connect_s"),
        }
        if "error" in pub:
            row["pub_error"] = pub["error"]
        reasons = []
        if "error" in pub or not sent:
            reasons.append("publisher error")
        if codec == "simulcast" and final:
            row.update(simulcast_row(final, finals.get(stream, {}).get("layer_changes", [])))
            reasons += simulcast_reasons(row, sent)
        if not final:
            reasons.append("no final stats")
        else:
            if decode == "all":
                if (row["frames_decoded"] or 0) < 0.99 * sent:
                    reasons.append("decoded < 99% of sent")
            else:
                if (row["frames_in"] or 0) < 0.99 * sent:
                    reasons.append("frames_in < 99% of sent")
                if (row["keyframes_decoded"] or 0) < 0.99 * ksent:
                    reasons.append("keyframes decoded < 99% of keyframes sent")
        if loss is None:
            reasons.append("no RTP stats")
        elif loss > 0.01:
            reasons.append("RTP loss > 1%")
        row["fail"] = reasons
        per.append(row)

    win_s = win1[0] - win0[0]
    server_cpu = (win1[1] - win0[1]) if win1[1] is not None and win0[1] is not None else None
    host_busy = (win1[2][0] - win0[2][0]) / max(1, win1[2][1] - win0[2][1])

    def ratio(key: str, denom: str) -> list[float]:
        return [r[key] / r[denom] for r in per if r.get(key) is not None and r.get(denom)]

    step.update(
        {
            "passed": all(not r["fail"] for r in per),
            "sessions_failing": sum(1 for r in per if r["fail"]),
            "fail_reasons": sorted({x for r in per for x in r["fail"]}),
            "decoded_over_sent_min": round(min(ratio("frames_decoded", "sent"), default=0), 4),
            "decoded_over_sent_median": round(
                statistics.median(ratio("frames_decoded", "sent") or [0]), 4
            ),
            "frames_in_over_sent_min": round(min(ratio("frames_in", "sent"), default=0), 4),
            "loss_max": max((r["loss"] for r in per if r["loss"] is not None), default=None),
            "rtp_stats_age_max_s": max(
                (r["rtp_stats_age_s"] for r in per if r["rtp_stats_age_s"] is not None),
                default=None,
            ),
            "dropped_total": sum(r["frames_dropped"] or 0 for r in per),
            "sent_total": sum(r["sent"] for r in per),
            "decoded_total": sum(r["frames_decoded"] or 0 for r in per),
            "window_s": round(win_s, 2),
            "server_cpu_cores": None if server_cpu is None else round(server_cpu / win_s, 3),
            "server_cpu_pct_of_one_core_per_session": None
            if server_cpu is None
            else round(100 * server_cpu / win_s / n, 2),
            "publishers_cpu_cores": round((pub_cpu1 - pub_cpu0) / win_s, 3),
            "publisher_cpu_pct_of_one_core_each": round(100 * (pub_cpu1 - pub_cpu0) / win_s / n, 2),
            "publisher_total_cpu_s_median": statistics.median(
                [r["pub_cpu_s"] for r in per if r["pub_cpu_s"] is not None] or [0]
            ),
            "host_busy_pct": round(100 * host_busy, 1),
            "server_cpu_s_whole_step": None
            if cpu1 is None or cpu0 is None
            else round(cpu1 - cpu0, 2),
            "step_wall_s": round(t1 - t0, 1),
        }
    )
    step["sessions"] = per if args.per_session else [r for r in per if r["fail"]][:5]
    log(
        f"{tag}: {'PASS' if step['passed'] else 'FAIL'} decoded/sent min "
        f"{step['decoded_over_sent_min']} loss max {step['loss_max']} drops "
        f"{step['dropped_total']} server {step['server_cpu_cores']} cores, publishers "
        f"{step['publishers_cpu_cores']} cores, host busy {step['host_busy_pct']}% "
        f"{step['fail_reasons']}"
    )
    return step


def simulcast_row(final: dict[str, Any], changes: list[dict[str, Any]]) -> dict[str, Any]:
    """A simulcast session's layer figures from its final video ``stats`` (``layers``:
    rid, size, frames_in, decoding) and its ``simulcast_layer`` events: the decoded
    layer, the highest layer offered, and every layer the server chose to decode, in
    order (``layer_decoded``: the first choice, then each switch)."""
    layers = list(final.get("layers") or [])
    decoding = [layer for layer in layers if layer.get("decoding")]
    highest = max(
        layers, key=lambda la: (la.get("width") or 0) * (la.get("height") or 0), default={}
    )
    return {
        "decoded_layer": decoding[0] if len(decoding) == 1 else decoding,
        "highest_layer": highest,
        "layers_frames_in": {str(la.get("rid")): la.get("frames_in") for la in layers},
        "layers_decoded_in_turn": [
            c.get("rid") for c in changes if c.get("change") == "layer_decoded"
        ],
    }


def simulcast_reasons(row: dict[str, Any], sent: int) -> list[str]:
    """Failures of a simulcast session (with ``pipeline.simulcast = highest``) beside the
    single-layer rules (which then read ``frames_decoded``: the decoder only ever had the
    highest layer when these pass): one layer decoded, the highest (by picture size), the
    only one the server ever chose, and its own frames_in >= 99 % of the frames sent on
    it."""
    decoded, highest = row["decoded_layer"], row["highest_layer"]
    if not isinstance(decoded, dict) or not decoded:
        return ["not exactly one layer decoded"]
    reasons = []
    if not highest or decoded.get("rid") != highest.get("rid"):
        reasons.append("decoded layer not the highest")
    if set(row["layers_decoded_in_turn"]) - {decoded.get("rid")}:
        reasons.append("another layer decoded on the way")
    if (decoded.get("frames_in") or 0) < 0.99 * sent:
        reasons.append("decoded layer frames_in < 99% of sent")
    return reasons


# ---------------------------------------------------------------- memory per session


async def metric_value(http: aiohttp.ClientSession, base: str, name: str) -> float | None:
    """One gauge from ``GET /metrics`` (``<prefix><name> <value>``), or None."""
    with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
        async with http.get(f"{base}/metrics", timeout=aiohttp.ClientTimeout(5)) as response:
            text = await response.text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if not line.startswith("#") and key.endswith(name):
                return float(value)
    return None


async def live_sessions(http: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
        async with http.get(f"{base}/v1/sessions", timeout=aiohttp.ClientTimeout(5)) as response:
            body = await response.json()
        items = body.get("sessions", body.get("items", body)) if isinstance(body, dict) else body
        return [item for item in items or [] if isinstance(item, dict)]
    return []


async def wait_sessions(
    http: aiohttp.ClientSession, base: str, count: int, timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """Poll ``GET /v1/sessions`` until exactly ``count`` sessions are live (and, for a
    nonzero count, connected); raises ``RuntimeError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        items = await live_sessions(http, base)
        if len(items) == count and all(item.get("connected") for item in items):
            return items
        if time.monotonic() > deadline:
            states = [item.get("state") for item in items]
            raise RuntimeError(f"{len(items)} sessions live ({states}), waiting for {count}")
        await asyncio.sleep(0.25)


async def steady_rss(pid: int, settle_s: float = 2.0, window_s: float = 2.0) -> int | None:
    """The server's VmRSS (KiB): the median of samples over ``window_s`` after
    ``settle_s`` (freed memory goes back to the allocator, not always to the system)."""
    await asyncio.sleep(settle_s)
    samples = []
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        value = rss_kib(pid)
        if value is not None:
            samples.append(value)
        await asyncio.sleep(0.2)
    return round(statistics.median(samples)) if samples else None


class IdlePublishers:
    """The :data:`IDLE_PUBLISHERS` process: ``n`` connected publishers sending nothing."""

    def __init__(self, base: str, n: int, prefix: str, work: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", IDLE_PUBLISHERS, base, str(n), prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=work,
            env=env,
        )

    async def ready(self, timeout_s: float = 60.0) -> list[str]:
        """The connection state of each publisher once all have settled."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout_s)
        if not line:
            raise RuntimeError(f"idle publishers exited ({self.proc.poll()}) before connecting")
        states: list[str] = json.loads(line)["states"]
        return states

    async def close(self, timeout_s: float = 30.0) -> None:
        """Close stdin (the publishers DELETE their sessions and exit); kill if late."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.to_thread(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)


def start_pushers(
    base: str, n: int, prefix: str, clip: Path, push_s: float, work: Path
) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ""
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PUBLISHER,
                f"{base}/whip/{prefix}{i:03d}",
                str(clip),
                str(push_s),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=work,
            env=env,
        )
        for i in range(n)
    ]


async def finish_pushers(
    pubs: list[subprocess.Popen[bytes]], timeout_s: float
) -> list[dict[str, Any]]:
    """Each publisher's JSON report (its last stdout line), waiting for all of them up to
    ``timeout_s`` in total (at least 1 s each); one still running then is killed.

    Cancellation: stops waiting; the publishers keep running (the callers kill them)."""
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    for pub in pubs:
        try:
            out, _ = await asyncio.to_thread(
                pub.communicate, None, max(1.0, deadline - time.monotonic())
            )
            lines = out.decode(errors="replace").strip().splitlines()
            results.append(json.loads(lines[-1]) if lines else {"error": "no output"})
        except subprocess.TimeoutExpired:
            pub.kill()
            pub.wait(5)
            results.append({"error": "timeout (killed)"})
        except ValueError as exc:
            results.append({"error": f"bad output: {exc}"})
    return results


def kill_pushers(pubs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every publisher still running (these PIDs only) and reap it."""
    for pub in pubs:
        if pub.poll() is None:
            pub.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                pub.wait(5)


def per_session_kib(total: int | None, base: int | None, n: int) -> float | None:
    return None if total is None or base is None else round((total - base) / n, 1)


async def memory_step(
    args: argparse.Namespace, work: Path, phase: str, n: int, clip: Path, repeat: int
) -> dict[str, Any]:
    """One fresh server: RSS at rest, after a warm-up session (one-time costs: codec and
    module initialisation, allocator arenas), with ``n`` sessions (``idle``: connected,
    no media; ``push``: 720p30 stream copy), and after they closed."""
    tag = f"mem-{phase}-{n}-{repeat}"
    data_dir = work / f"data-{tag}"  # fresh: a reused one would carry the last run's runs
    server = start_server(data_dir, work / f"server-{tag}.log", n, "all")
    step: dict[str, Any] = {"phase": phase, "n": n, "repeat": repeat}
    idle: IdlePublishers | None = None
    pubs: list[subprocess.Popen[bytes]] = []
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_ready()
            step["rss_start_kib"] = await steady_rss(server.pid)
            # warm-up: one session of the same kind, closed again
            if phase == "idle":
                warm = IdlePublishers(server.base, 1, "warm", work)
                try:
                    await warm.ready()
                    await wait_sessions(http, server.base, 1)
                finally:
                    await warm.close()
            else:
                warm_pubs = start_pushers(server.base, 1, "warm", clip, 3.0, work)
                await finish_pushers(warm_pubs, 60)
            await wait_sessions(http, server.base, 0)
            step["rss_warm_kib"] = await steady_rss(server.pid)
            started = time.monotonic()
            if phase == "idle":
                idle = IdlePublishers(server.base, n, "idle", work)
                states = await idle.ready()
                step["publisher_states"] = {s: states.count(s) for s in sorted(set(states))}
                await wait_sessions(http, server.base, n)
                step["connect_s"] = round(time.monotonic() - started, 2)
                step["rss_sessions_kib"] = await steady_rss(server.pid, 3.0, 3.0)
                samples = [step["rss_sessions_kib"]]
            else:
                pubs = start_pushers(server.base, n, "push", clip, args.push_s, work)
                await wait_sessions(http, server.base, n)
                step["connect_s"] = round(time.monotonic() - started, 2)
                await asyncio.sleep(4.0)  # decoders opened, queues in their steady state
                samples = []
                end = started + args.push_s - 2.0
                while time.monotonic() < end:
                    value = rss_kib(server.pid)
                    if value is not None:
                        samples.append(value)
                    await asyncio.sleep(0.5)
                step["rss_sessions_kib"] = round(statistics.median(samples)) if samples else None
            step["rss_sessions_max_kib"] = max((v for v in samples if v is not None), default=None)
            reserved = await metric_value(http, server.base, "media_budget_bytes_reserved")
            threads = await metric_value(http, server.base, "media_budget_threads_reserved")
            step["reserved_bytes_per_session"] = None if reserved is None else round(reserved / n)
            step["reserved_threads_per_session"] = None if threads is None else threads / n
            if idle is not None:
                await idle.close()
            results = await finish_pushers(pubs, args.push_s + 60) if pubs else []
            await wait_sessions(http, server.base, 0)
            step["rss_after_kib"] = await steady_rss(server.pid)
    finally:
        if idle is not None:
            idle.kill()
        kill_pushers(pubs)
        step["server_stop"] = server.shutdown()
    step["server_log_problems"] = server.problems(first=5)
    start_kib, warm_kib = step.get("rss_start_kib"), step.get("rss_warm_kib")
    step["one_time_kib"] = per_session_kib(warm_kib, start_kib, 1)
    step["per_session_kib"] = per_session_kib(step.get("rss_sessions_kib"), start_kib, n)
    step["per_session_max_kib"] = per_session_kib(step.get("rss_sessions_max_kib"), start_kib, n)
    step["per_session_after_warm_kib"] = per_session_kib(step.get("rss_sessions_kib"), warm_kib, n)
    step["kept_after_close_kib"] = per_session_kib(step.get("rss_after_kib"), start_kib, 1)
    if phase == "push":
        finals = read_final_stats(data_dir)
        sent = sum(r.get("frames_sent", 0) for r in results)
        decoded = dropped = 0
        for i in range(n):
            final = finals.get(f"push{i:03d}", {}).get("final", {})
            decoded += final.get("frames_decoded") or 0
            dropped += final.get("frames_dropped") or 0
        step["frames_sent"], step["frames_decoded"], step["frames_dropped"] = sent, decoded, dropped
        step["decoded_over_sent"] = round(decoded / sent, 4) if sent else None
        step["publisher_errors"] = [r["error"] for r in results if "error" in r][:3]
    log(
        f"{tag}: RSS start {step.get('rss_start_kib')} KiB, warm {warm_kib} KiB, with {n} "
        f"sessions {step.get('rss_sessions_kib')} KiB (max {step.get('rss_sessions_max_kib')}), "
        f"after {step.get('rss_after_kib')} KiB: {step['per_session_kib']} KiB per session"
    )
    return step


async def run_memory(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    width, height, bitrate = SIZES["720p"]
    clip = work / "clip_720p.mp4"
    await asyncio.to_thread(make_clip, clip, width, height, bitrate, args.clip_s)
    steps = args.steps or [4, 8]
    out: dict[str, Any] = {}
    for phase in ("idle", "push"):
        results = []
        for repeat in range(args.memory_repeats):
            for n in steps:
                results.append(await memory_step(args, work, phase, n, clip, repeat))
        per_n: dict[str, Any] = {}
        for n in steps:
            mine = [r for r in results if r["n"] == n]
            values = [r["per_session_kib"] for r in mine if r["per_session_kib"] is not None]
            totals = [
                r["rss_sessions_kib"] - r["rss_start_kib"]
                for r in mine
                if r.get("rss_sessions_kib") is not None and r.get("rss_start_kib") is not None
            ]
            warm = [
                r["per_session_after_warm_kib"]
                for r in mine
                if r["per_session_after_warm_kib"] is not None
            ]
            per_n[str(n)] = {
                "per_session_kib_median": round(statistics.median(values), 1) if values else None,
                "per_session_kib": values,
                "per_session_after_warm_kib_median": round(statistics.median(warm), 1)
                if warm
                else None,
                "delta_kib_median": round(statistics.median(totals)) if totals else None,
            }
        slope = None
        if len(steps) >= 2:
            low, high = per_n[str(min(steps))], per_n[str(max(steps))]
            if low["delta_kib_median"] is not None and high["delta_kib_median"] is not None:
                slope = round(
                    (high["delta_kib_median"] - low["delta_kib_median"])
                    / (max(steps) - min(steps)),
                    1,
                )
        out[phase] = {"by_n": per_n, "marginal_kib_per_session": slope, "steps": results}
    return out


# ---------------------------------------------------------------- main


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    clips: dict[tuple[str, str], Path | str] = {}
    for res in sorted({CONFIGS[c][0] for c in args.only}):
        width, height, bitrate = SIZES[res]
        path = work / f"clip_{res}.mp4"
        started = time.monotonic()
        await asyncio.to_thread(make_clip, path, width, height, bitrate, args.clip_s)
        clips[(res, "ffmpeg")] = path
        log(f"clip {path.name}: {path.stat().st_size} bytes in {time.monotonic() - started:.1f} s")
        for codec in args.codecs:
            if codec == "ffmpeg":
                continue
            if codec == "simulcast":
                if res != "720p":
                    continue
                started = time.monotonic()
                clips[(res, codec)] = await asyncio.to_thread(encode_layers, path, work, res)
                log(f"simulcast layers of {path.name} in {time.monotonic() - started:.1f} s")
                continue
            frames_path = work / f"clip_{res}.{codec}.frames"
            started = time.monotonic()
            count = await asyncio.to_thread(encode_frames, path, codec, bitrate, frames_path)
            clips[(res, codec)] = frames_path
            log(
                f"clip {frames_path.name}: {count} frames, {frames_path.stat().st_size} bytes "
                f"in {time.monotonic() - started:.1f} s"
            )
    configs: dict[str, Any] = {}
    for config, codec in [(c, k) for c in args.only for k in args.codecs]:
        res, decode, steps = CONFIGS[config]
        if (res, codec) not in clips:
            log(f"{config}:{codec}: skipped (simulcast is 720p's three layers)")
            continue
        name = config if codec == "ffmpeg" else f"{config}:{codec}"
        if args.steps:
            steps = args.steps
        if args.quick:
            steps = steps[:1] if not args.steps else args.steps[:1]
        # Each N runs once per mode, back to back (the same run, the same host load); a
        # mode stops stepping at its first failing N, the other goes on.
        results: dict[bool, list[dict[str, Any]]] = {mode: [] for mode in args.udp_mux}
        best = dict.fromkeys(args.udp_mux, 0)
        for n in steps:
            going = [m for m in args.udp_mux if not results[m] or results[m][-1]["passed"]]
            if not going:
                break
            for mode in going:
                step = await run_step(
                    args, work, res, decode, n, clips[(res, codec)], args.spy, mode, codec
                )
                results[mode].append(step)
                if step["passed"]:
                    best[mode] = n
        for mode in args.udp_mux:
            key = name if mode == args.udp_mux[0] else f"{name}:nomux"
            configs[key] = {
                "resolution": res,
                "decode": decode,
                "udp_mux": mode,
                "codec": codec,
                "steps_tried": [s["n"] for s in results[mode]],
                "largest_passing_n": best[mode],
                "ceiling_reached": bool(results[mode]) and not results[mode][-1]["passed"],
                "steps": results[mode],
            }
            log(f"{key}: largest passing N = {best[mode]} udp_mux={mode}")
    return configs


def compare_codecs(configs: dict[str, Any]) -> dict[str, Any]:
    """Per (resolution, decode, mux mode): each codec's largest passing N and, by N, its
    server CPU per session (% of one core) where the step passed."""
    out: dict[str, Any] = {}
    for config in configs.values():
        if config.get("codec") == "simulcast":  # simulcast_comparison
            continue
        mode = "" if config["udp_mux"] else ":nomux"
        group = f"{config['resolution']}:{config['decode']}{mode}"
        row = out.setdefault(group, {})
        row[config.get("codec", "ffmpeg")] = {
            "largest_passing_n": config["largest_passing_n"],
            "cpu_pct_per_session_by_n": {
                str(step["n"]): step.get("server_cpu_pct_of_one_core_per_session")
                for step in config["steps"]
                if step["passed"]
            },
        }
    return {group: row for group, row in out.items() if len(row) > 1}


def compare_simulcast(configs: dict[str, Any]) -> dict[str, Any]:
    """Per (resolution, decode, mux mode) where both ran: the 3-layer simulcast publisher
    (``highest`` decoded) beside the single-layer OBS-shaped ``h264`` one, each's largest
    passing N and, at every N both ran, the server CPU per session (% of one core) of
    each, simulcast over single layer, and whether each step passed."""
    groups: dict[str, dict[str, Any]] = {}
    for config in configs.values():
        if config.get("codec") in ("h264", "simulcast"):
            mode = "" if config["udp_mux"] else ":nomux"
            group = f"{config['resolution']}:{config['decode']}{mode}"
            groups.setdefault(group, {})[config["codec"]] = config
    out: dict[str, Any] = {}
    for group, pair in groups.items():
        if len(pair) < 2:
            continue
        single = {step["n"]: step for step in pair["h264"]["steps"]}
        by_n: dict[str, Any] = {}
        for step in pair["simulcast"]["steps"]:
            other = single.get(step["n"])
            if other is None:
                continue
            layered = step.get("server_cpu_pct_of_one_core_per_session")
            one = other.get("server_cpu_pct_of_one_core_per_session")
            by_n[str(step["n"])] = {
                "simulcast_cpu_pct_per_session": layered,
                "single_layer_cpu_pct_per_session": one,
                "simulcast_over_single_layer": round(layered / one, 3) if layered and one else None,
                "simulcast_passed": step["passed"],
                "single_layer_passed": other["passed"],
            }
        out[group] = {
            "largest_passing_n": {
                "simulcast": pair["simulcast"]["largest_passing_n"],
                "single_layer_h264": pair["h264"]["largest_passing_n"],
            },
            "by_n": by_n,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small step per configuration")
    parser.add_argument(
        "--only",
        default=",".join(CONFIGS),
        help=f"comma-separated configurations (default: all of {','.join(CONFIGS)})",
    )
    parser.add_argument("--steps", default="", help="override N steps, e.g. 8,16,24")
    parser.add_argument("--push-s", type=float, default=20.0, help="seconds each publisher pushes")
    parser.add_argument("--clip-s", type=float, default=10.0)
    parser.add_argument("--spy", action="store_true", help="py-spy record the server per step")
    parser.add_argument("--dump", action="store_true", help="with --spy: also a py-spy dump")
    parser.add_argument("--per-session", action="store_true", help="every session's row")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, data)")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="memory per session instead of the capacity sweep: server RSS idle and at "
        "720p30 (--steps, default 4,8)",
    )
    parser.add_argument(
        "--memory-repeats", type=int, default=1, help="with --memory: runs per step (median)"
    )
    parser.add_argument(
        "--udp-mux",
        choices=("both", "on", "off"),
        default="both",
        help="ICE sockets: the shared UDP port, a socket per session, or both in the same "
        "run (each N back to back; the comparison is in mux_comparison)",
    )
    parser.add_argument(
        "--codecs",
        default="ffmpeg",
        help=f"comma-separated publishers/codecs of {','.join(CODECS)} (module doc)",
    )
    args = parser.parse_args(argv)
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    for codec in args.codecs:
        if codec not in CODECS:
            parser.error(f"unknown codec {codec!r}")
    args.udp_mux = {"both": [True, False], "on": [True], "off": [False]}[args.udp_mux]
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    for name in args.only:
        if name not in CONFIGS:
            parser.error(f"unknown configuration {name!r}")
    args.steps = [int(s) for s in args.steps.split(",") if s.strip()]
    if args.quick:
        args.push_s = min(args.push_s, 10.0)
        if not args.steps:
            args.steps = [4]
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    log(f"work dir {work}")
    if args.memory:
        args.push_s = args.push_s if args.push_s != 20.0 else 15.0
        try:
            memory = asyncio.run(run_memory(args, work))
        finally:
            if not args.keep:
                import shutil

                shutil.rmtree(work, ignore_errors=True)
        json.dump(
            {
                "bench": "capacity-memory",
                "push_s": args.push_s,
                "method": "fresh server per step; RSS (VmRSS of the server process) at rest, "
                "after one warm-up session of the same kind was opened and closed, with N "
                "sessions (idle: aiortc publishers with a video track that sends nothing; "
                "push: FFmpeg WHIP stream copy of a 720p30 clip, the median of samples every "
                "0.5 s from 4 s after all connected to 2 s before the end), and after they "
                "closed; per session = (with N - at rest) / N, so it includes the one-time "
                "costs spread over N (after_warm: (with N - after warm-up) / N, which "
                "undercounts: the N sessions reuse what the warm-up freed); marginal = the "
                "slope of (with N - at rest) between the smallest and largest N, the cost "
                "of one more session",
                "memory": memory,
                "host": {"cpus": len(os.sched_getaffinity(0))},
                "elapsed_s": round(time.monotonic() - started, 1),
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return 0
    try:
        configs = asyncio.run(run(args, work))
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    import av

    out = {
        "bench": "capacity",
        "push_s": args.push_s,
        "criteria": "per session: RTP loss <= 1%, decoded >= 99% of sent "
        "(keyframes policy: frames_in >= 99% of sent and keyframes decoded >= 99% of keyframes "
        "sent; simulcast: of the decoded layer, which must be the highest and the only one "
        "ever decoded, with its own frames_in >= 99% of sent)",
        "publisher": "python -c subprocess, PyAV/FFmpeg WHIP muxer, stream copy, paced by pts",
        "summary": {k: v["largest_passing_n"] for k, v in configs.items()},
        "mux_comparison": compare_udp_mux(configs),
        "codec_comparison": compare_codecs(configs),
        "simulcast_comparison": compare_simulcast(configs),
        "configs": configs,
        "host": {
            "cpus": len(os.sched_getaffinity(0)),
            "note": "server and all publishers share these CPUs",
            "pyav": av.__version__,
        },
        "work_dir": str(work) if args.keep else None,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
