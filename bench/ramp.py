#!/usr/bin/env python3
"""Chromium's bitrate ramp against the server: per start bitrate, transport-cc vs REMB.

Prints one JSON document on stdout; progress goes to stderr.

Per mode, in one run: a fresh server subprocess (``bench/support/server_process.py``) and a
fresh headless Chromium (``bench/support/browser_publisher.py``) pushing 1280x720 VP8 with
no bitrate hints for ``--seconds`` (default 16). Modes:

- ``default``: the server's defaults (transport-cc feedback, ``pipeline.start_bitrate_bps``
  1 Mb/s in the answer's ``x-google-start-bitrate``, ``pipeline.max_bitrate_bps`` 10 Mb/s
  in its ``b=AS``/``b=TIAS`` and REMB);
- ``no-start``: transport-cc, no start bitrate in the answer (Chromium's own 300 kb/s);
- ``remb``: ``pipeline.transport_cc = false`` and no start bitrate (aiortc's REMB, the
  behaviour before transport-cc was answered); ``remb+start``: the same with 1 Mb/s;
- ``start-N`` for each ``--start-bps N``: transport-cc with a start of N b/s.

The camera is ``--camera busy`` (default: ``bench/support/busy_video.py``'s loop, a picture
that needs about 2 Mb/s), ``medium`` (its :data:`~bench.support.busy_video.MEDIUM` preset:
about 1.7 Mb/s at 640x360 at a low QP) or ``fake`` (Chromium's own pattern, which VP8
codes at under 1 Mb/s at 720p whatever it may send, so the received bitrate shows the
content, not the ramp; Chromium's estimate and resolution still do).

Every second after the answer: the server's view (``GET /v1/sessions``: received
``bitrate_bps`` of the session, the video track's ``fps`` and size) and Chromium's
(getStats: ``availableOutgoingBitrate``, the encoder's ``targetBitrate``, the sent fps and
frame size, the quality limitation and resolution changes, and the mean VP8 QP of the
frames encoded in that second, 0-127: libwebrtc's quality scaler goes up a resolution step
while it stays at or under 29, down over 95). Summary per mode: the first second at which
the server received >= 1.5 Mb/s, at which it decoded >= 29 fps, both at once, 30 fps at
1280x720, and the peaks. Issue 12's target: within 10 s.

Usage::

    .venv/bin/python bench/ramp.py                 # default, no-start and remb; busy camera
    .venv/bin/python bench/ramp.py --camera fake --seconds 10 --modes default no-start
    .venv/bin/python bench/ramp.py --modes default --start-bps 500000 2000000
    .venv/bin/python bench/ramp.py --camera medium --modes default \\
        --ceiling-bps 6000000 6000000:2500000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from bench.support.browser_publisher import BrowserPublisher, chromium_binary
from bench.support.busy_video import MEDIUM, write_busy_mjpeg
from bench.support.server_process import ServerProcess, log

TARGET_BPS = 1_500_000
TARGET_FPS = 29.0
NO_START = {"WHIP_INGEST_PIPELINE_START_BITRATE_BPS": "0"}
MODES: dict[str, dict[str, str]] = {
    "default": {},
    "no-start": {"WHIP_INGEST_PIPELINE_TRANSPORT_CC": "true", **NO_START},
    "remb": {"WHIP_INGEST_PIPELINE_TRANSPORT_CC": "false", **NO_START},
    "remb+start": {
        "WHIP_INGEST_PIPELINE_TRANSPORT_CC": "false",
        "WHIP_INGEST_PIPELINE_START_BITRATE_BPS": "1000000",
    },
}


def ceiling_mode(spec: str) -> tuple[str, dict[str, str]]:
    """``N`` or ``N:START``: transport-cc with ``pipeline.max_bitrate_bps`` = N announced
    (b=AS/b=TIAS and the REMB cap), and the start bitrate START (default: the server's)."""
    ceiling, _, start = spec.partition(":")
    env = {
        "WHIP_INGEST_PIPELINE_TRANSPORT_CC": "true",
        "WHIP_INGEST_PIPELINE_MAX_BITRATE_BPS": str(int(ceiling)),
    }
    if start:
        env["WHIP_INGEST_PIPELINE_START_BITRATE_BPS"] = str(int(start))
    return f"ceiling-{spec}", env


def start_mode(bps: int) -> tuple[str, dict[str, str]]:
    """The mode pushing against transport-cc with a start bitrate of ``bps``."""
    return f"start-{bps}", {
        "WHIP_INGEST_PIPELINE_TRANSPORT_CC": "true",
        "WHIP_INGEST_PIPELINE_START_BITRATE_BPS": str(bps),
    }


async def _session(http: aiohttp.ClientSession, base: str) -> dict[str, Any] | None:
    async with http.get(f"{base}/v1/sessions") as response:
        items = (await response.json())["items"]
    return items[0] if items else None


def _mean_qp(sent: dict[str, Any], before: dict[str, Any]) -> float | None:
    """The mean QP of the frames encoded between two getStats views, or None."""
    frames = (sent.get("framesEncoded") or 0) - (before.get("framesEncoded") or 0)
    qp = (sent.get("qpSum") or 0) - (before.get("qpSum") or 0)
    return round(qp / frames, 1) if frames > 0 and sent.get("qpSum") is not None else None


def _sample(
    second: int, session: dict[str, Any] | None, view: dict[str, Any], before: dict[str, Any]
) -> dict[str, Any]:
    video = next((t for t in (session or {}).get("tracks", []) if t["kind"] == "video"), {})
    sent = view.get("video") or {}
    return {
        "t_s": second,
        "server_bitrate_bps": (session or {}).get("bitrate_bps"),
        "server_video_bitrate_bps": video.get("bitrate_bps"),
        "server_fps": video.get("fps"),
        "server_size": [video.get("width"), video.get("height")],
        "chromium_available_bps": view.get("availableOutgoingBitrate"),
        "chromium_target_bps": sent.get("targetBitrate"),
        "chromium_fps": sent.get("fps"),
        "chromium_size": [sent.get("width"), sent.get("height")],
        "chromium_limitation": sent.get("limitation"),
        "chromium_resolution_changes": sent.get("resolutionChanges"),
        "chromium_mean_qp": _mean_qp(sent, before.get("video") or {}),
    }


def _first(samples: list[dict[str, Any]], ok: Any) -> int | None:
    return next((s["t_s"] for s in samples if ok(s)), None)


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def peak(key: str) -> Any:
        return max((s[key] for s in samples if s[key] is not None), default=None)

    return {
        "first_s_server_ge_1_5_mbps": _first(
            samples, lambda s: (s["server_video_bitrate_bps"] or 0) >= TARGET_BPS
        ),
        "first_s_server_30fps_720p": _first(
            samples,
            lambda s: (s["server_fps"] or 0) >= TARGET_FPS and s["server_size"] == [1280, 720],
        ),
        "first_s_server_ge_29fps": _first(samples, lambda s: (s["server_fps"] or 0) >= TARGET_FPS),
        "first_s_server_ge_1_5_mbps_and_29fps": _first(
            samples,
            lambda s: (
                (s["server_video_bitrate_bps"] or 0) >= TARGET_BPS
                and (s["server_fps"] or 0) >= TARGET_FPS
            ),
        ),
        "first_s_chromium_sends_720p": _first(samples, lambda s: s["chromium_size"] == [1280, 720]),
        "first_s_chromium_estimate_ge_1_5_mbps": _first(
            samples, lambda s: (s["chromium_available_bps"] or 0) >= TARGET_BPS
        ),
        "peak_server_video_bitrate_bps": peak("server_video_bitrate_bps"),
        "peak_chromium_available_bps": peak("chromium_available_bps"),
        "peak_chromium_target_bps": peak("chromium_target_bps"),
        "last": samples[-1] if samples else None,
    }


async def run_mode(
    mode: str, mode_env: dict[str, str], seconds: int, camera: list[str], work: Path
) -> dict[str, Any]:
    binary = chromium_binary()
    if binary is None:
        raise SystemExit("bench/ramp.py needs Chromium (apt-get install chromium)")
    env = {**mode_env, "WHIP_INGEST_PIPELINE_STATS_INTERVAL_S": "1"}
    data = work / mode
    data.mkdir()
    server = ServerProcess(f"ramp {mode}", data / "data", data / "server.log", 2, env)
    browser = BrowserPublisher(binary, camera)
    samples: list[dict[str, Any]] = []
    try:
        await server.wait_ready()
        await browser.start()
        log(f"ramp {mode}", f"chromium pid {browser.pid} publishing")
        answer = await browser.evaluate(f"publish('{server.base}/whip/bench', 1280, 720)")
        negotiated = "transport-cc" in answer["answer"]
        announced = re.search(r"x-google-start-bitrate=(\d+)", answer["answer"])
        started = time.monotonic()
        view: dict[str, Any] = {}
        async with aiohttp.ClientSession() as http:
            for second in range(1, seconds + 1):
                await asyncio.sleep(max(0.0, started + second - time.monotonic()))
                session = await _session(http, server.base)
                view, before = await browser.evaluate("outbound()"), view
                samples.append(_sample(second, session, view, before))
                log(f"ramp {mode}", json.dumps(samples[-1]))
        await browser.evaluate("stop()")
    finally:
        await browser.close()
        stop = server.shutdown()
    return {
        "env": env,
        "answer_has_transport_cc": negotiated,
        "answer_start_bitrate_kbps": int(announced.group(1)) if announced else None,
        "summary": _summary(samples),
        "per_second": samples,
        "server_problems": server.problems(first=3),
        "server_stop": stop,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=16)
    parser.add_argument("--camera", choices=("busy", "medium", "fake"), default="busy")
    parser.add_argument(
        "--modes", nargs="*", choices=tuple(MODES), default=["default", "no-start", "remb"]
    )
    parser.add_argument(
        "--start-bps", nargs="*", type=int, default=[], help="add a start-N mode per value"
    )
    parser.add_argument(
        "--ceiling-bps",
        nargs="*",
        default=[],
        help="add a ceiling mode per value, N or N:START (max bitrate N announced, start START)",
    )
    args = parser.parse_args()
    modes = {mode: MODES[mode] for mode in args.modes}
    modes.update(start_mode(bps) for bps in args.start_bps)
    modes.update(ceiling_mode(spec) for spec in args.ceiling_bps)
    with tempfile.TemporaryDirectory(prefix="bench-ramp-") as tmp:
        work = Path(tmp)
        camera = ["--use-fake-device-for-media-stream=fps=30"]
        if args.camera != "fake":
            preset = MEDIUM if args.camera == "medium" else {}
            video = write_busy_mjpeg(work / "camera.mjpeg", **preset)
            camera.append(f"--use-file-for-fake-video-capture={video}")
        results = {
            mode: await run_mode(mode, env, args.seconds, camera, work)
            for mode, env in modes.items()
        }
    print(
        json.dumps(
            {
                "bench": "ramp",
                "seconds": args.seconds,
                "camera": args.camera,
                "resolution": [1280, 720],
                "codec": "VP8",
                "target": {"bitrate_bps": TARGET_BPS, "fps": 30, "within_s": 10},
                "host": {"python": platform.python_version(), "machine": platform.machine()},
                "modes": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
