"""GStreamer's webrtcbin as a WHIP publisher, for the tests: :func:`gst_whip_push` runs
``tests/support/gst_whip_push.py`` under the system Python, which has PyGObject and the
GStreamer 1.22 packages (Debian); the project's venv has neither, and needs neither.

- **Where GStreamer comes from.** The Debian packages in ``.ci/test-packages`` (``make
  test`` installs them when it runs as root). :func:`require_gstreamer` skips a test with a
  message saying what to install when they are missing, except under ``CI=true``, where
  it fails the test: CI must never pass by skipping.
- **Processes.** Each push is one subprocess, bounded: past its deadline it is killed
  (that PID only) and the test fails with its stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

SYSTEM_PYTHON = "/usr/bin/python3"
SCRIPT = Path(__file__).with_name("gst_whip_push.py")
ELEMENTS = ("webrtcbin", "nicesrc", "x264enc", "vp8enc", "opusenc", "rtph264pay", "rtpvp8pay")
PACKAGES = (
    "gstreamer1.0-plugins-bad gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly"
    " gstreamer1.0-nice gir1.2-gst-plugins-bad-1.0 python3-gi"
)
SLACK_S = 45.0
"""A push's bound beyond its media seconds: GStreamer's start, ICE, the HTTP answers."""

_PROBE = (
    "import gi, sys\n"
    "gi.require_version('Gst', '1.0'); gi.require_version('GstWebRTC', '1.0')\n"
    "gi.require_version('GstSdp', '1.0')\n"
    "from gi.repository import Gst, GstSdp, GstWebRTC\n"
    "Gst.init(None)\n"
    "missing = [e for e in sys.argv[1:] if Gst.ElementFactory.find(e) is None]\n"
    "print(' '.join(missing)); sys.exit(1 if missing else 0)\n"
)


def gstreamer_missing() -> str | None:
    """Why GStreamer's WHIP pushes cannot run here, or None when they can."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing"
    try:
        probe = subprocess.run(
            [SYSTEM_PYTHON, "-c", _PROBE, *ELEMENTS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "probing GStreamer took over 60 s"
    if probe.returncode == 0:
        return None
    missing = probe.stdout.strip()
    return f"GStreamer elements missing: {missing}" if missing else probe.stderr.strip()[-500:]


def require_gstreamer() -> None:
    """Skip the test when GStreamer cannot push here (fail instead under CI=true)."""
    why = gstreamer_missing()
    if why is None:
        return
    message = f"{why}: install the Debian packages {PACKAGES} (.ci/test-packages does it as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: GStreamer tests never skip)")
    pytest.skip(message)


async def gst_whip_push(
    url: str, seconds: float, codec: str, token: str | None = None
) -> dict[str, Any]:
    """One webrtcbin push of ``seconds`` of media (``codec``: ``h264`` or ``vp8``, with
    Opus) to ``url``; the script's JSON result. Raises AssertionError when the script
    fails, prints no result, or outlives its bound (then it is killed)."""
    argv = [SYSTEM_PYTHON, str(SCRIPT), url, str(seconds), codec, *([token] if token else [])]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), seconds + SLACK_S)
    except TimeoutError:
        proc.kill()
        _, stderr = await proc.communicate()
        raise AssertionError(
            f"webrtcbin push (pid {proc.pid}) outlived {seconds + SLACK_S} s:"
            f" {stderr.decode(errors='replace')[-2000:]}"
        ) from None
    lines = stdout.decode(errors="replace").strip().splitlines()
    result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or not result:
        raise AssertionError(
            f"webrtcbin push exited {proc.returncode}: {result.get('error')!r}"
            f" {result.get('post_body', '')!r}\n{stderr.decode(errors='replace')[-2000:]}"
        )
    return result
