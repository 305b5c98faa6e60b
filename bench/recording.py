"""What recording costs: server CPU per 720p30 session, recording off vs on, in one run.

Rules:

- One run alternates the two configurations (``--rounds`` rounds of off, then on), each
  on a fresh server process over its own data directory, so both see the same machine
  state; the figure compared is the median of each configuration's rounds.
- A round: one FFmpeg WHIP publisher process stream-copies a generated 720p30 H.264
  clip (GOP 30, about 2.5 Mb/s) for ``--seconds``; the server's CPU (utime + stime of
  its process, all threads, from ``/proc``) is read when the session is live and again
  when the push ends: CPU seconds per second of push is the session's cost (the idle
  server's share is in both configurations alike).
- Recording on: ``recording.enabled``, ``segment_s`` 10, fragmented MP4 into the round's
  data directory; the round also reports the bytes written and the segments.
- Everything is on 127.0.0.1; every process started is stopped (SIGINT, SIGKILL after a
  deadline) and only those. The result is one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import aiohttp  # noqa: E402

from bench.capacity import (  # noqa: E402
    cpu_s,
    finish_pushers,
    kill_pushers,
    make_clip,
    start_pushers,
)
from bench.support import server_process  # noqa: E402

SOURCE = "bench/recording"


def log(message: str) -> None:
    server_process.log(SOURCE, message)


async def _live(http: aiohttp.ClientSession, base: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        async with http.get(f"{base}/v1/sessions") as response:
            items = (await response.json())["items"]
        if items and any(t.get("frames_decoded", 0) > 0 for t in items[0].get("tracks", [])):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the session did not go live")


async def one_round(
    work: Path, clip: Path, seconds: float, record: bool, index: int
) -> dict[str, Any]:
    label = f"{'on' if record else 'off'}{index}"
    data = work / label
    env = {"WHIP_INGEST_RECORDING_ENABLED": "true" if record else "false"}
    if record:
        env["WHIP_INGEST_RECORDING_SEGMENT_S"] = "10"
    server = server_process.ServerProcess(SOURCE, data, work / f"{label}.log", 4, env)
    pubs = []
    try:
        await server.wait_ready()
        pubs = start_pushers(server.base, 1, label, clip, seconds + 2.0, work)
        async with aiohttp.ClientSession() as http:
            await _live(http, server.base)
            cpu0, t0 = cpu_s(server.pid), time.monotonic()
            results = await finish_pushers(pubs, seconds + 30)
            cpu1, t1 = cpu_s(server.pid), time.monotonic()
        if cpu0 is None or cpu1 is None:
            raise RuntimeError("server CPU unreadable")
        recorded = sorted((data / "recordings").glob("*/*.mp4")) if record else []
        return {
            "recording": record,
            "cpu_per_s": round((cpu1 - cpu0) / (t1 - t0), 4),
            "window_s": round(t1 - t0, 2),
            "frames_sent": results[0].get("frames_sent") if results else None,
            "publisher_error": results[0].get("error") if results else "none",
            "segments": len(recorded),
            "bytes_written": sum(p.stat().st_size for p in recorded),
        }
    finally:
        kill_pushers(pubs)
        await asyncio.to_thread(server.shutdown)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-recording-") as tmp:
        work = Path(tmp)
        clip = work / "clip_720p.mp4"
        await asyncio.to_thread(make_clip, clip, 1280, 720, 2_500_000, 10.0)
        rounds = []
        for index in range(args.rounds):
            for record in (False, True):
                result = await one_round(work, clip, args.seconds, record, index)
                log(json.dumps(result))
                rounds.append(result)
    off = statistics.median(r["cpu_per_s"] for r in rounds if not r["recording"])
    on = statistics.median(r["cpu_per_s"] for r in rounds if r["recording"])
    return {
        "bench": "recording",
        "clip": "720p30 H.264 baseline, GOP 30, 2.5 Mb/s (stream copy by FFmpeg's WHIP muxer)",
        "seconds_per_round": args.seconds,
        "server_cpu_per_s_off": off,
        "server_cpu_per_s_on": on,
        "recording_overhead_pct": round((on - off) / off * 100, 1) if off else None,
        "target_pct": 10.0,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="push length per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (off, on)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
