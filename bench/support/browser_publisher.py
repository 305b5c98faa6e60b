"""Headless Chromium as a WHIP publisher for the benches, driven over the DevTools protocol.

The tests have their own, fuller driver (``tests/support/chromium.py``); bench/ never
imports tests/, so this is the small part a bench needs: start one browser, load one page,
evaluate JavaScript, stop.

Rules:

- **Processes.** :class:`BrowserPublisher` starts one Chromium in its own process group with
  a fresh profile directory and records its PID; :meth:`BrowserPublisher.close` ends that
  group (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`) and removes the profile. It
  signals nothing else.
- **The page** is served from 127.0.0.1 by an aiohttp server of its own (another origin than
  the WHIP server's, as a browser publisher's is). ``publish(endpoint, width, height)``
  pushes the fake camera with no bitrate hints (no ``b=`` lines, no
  ``setParameters``); ``outbound()`` reads the sender's own getStats view: the estimator's
  ``availableOutgoingBitrate`` and the video ``outbound-rtp`` (``targetBitrate``,
  ``framesPerSecond``, frame size, ``bytesSent``, ``qualityLimitationReason``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

STOP_TIMEOUT_S = 5.0
START_TIMEOUT_S = 20.0

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--use-fake-ui-for-media-stream",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>bench</title><script>
let pc = null;
async function publish(endpoint, width, height) {
  const media = await navigator.mediaDevices.getUserMedia(
    {video: {width: width, height: height, frameRate: 30}, audio: true});
  pc = new RTCPeerConnection({iceServers: []});
  for (const track of media.getTracks()) {
    pc.addTransceiver(track, {direction: "sendonly", streams: [media]});
  }
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === "complete") { done(); return; }
    setTimeout(done, 5000);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { done(); }
    });
  });
  const response = await fetch(endpoint, {method: "POST",
    headers: {"Content-Type": "application/sdp"}, body: pc.localDescription.sdp});
  const answer = await response.text();
  if (response.status !== 201) { throw new Error(response.status + " " + answer); }
  await pc.setRemoteDescription({type: "answer", sdp: answer});
  return {status: response.status, location: response.headers.get("Location"), answer: answer};
}
async function outbound() {
  const stats = await pc.getStats();
  const out = {availableOutgoingBitrate: null, video: null};
  stats.forEach((r) => {
    if (r.type === "candidate-pair" && r.nominated && r.state === "succeeded") {
      out.availableOutgoingBitrate = r.availableOutgoingBitrate ?? null;
    }
    if (r.type === "outbound-rtp" && r.kind === "video") {
      out.video = {targetBitrate: r.targetBitrate ?? null, fps: r.framesPerSecond ?? null,
        width: r.frameWidth ?? null, height: r.frameHeight ?? null, bytesSent: r.bytesSent,
        limitation: r.qualityLimitationReason || null, qpSum: r.qpSum ?? null,
        framesEncoded: r.framesEncoded ?? null,
        resolutionChanges: r.qualityLimitationResolutionChanges ?? null};
    }
  });
  return out;
}
function stop() { if (pc !== null) { pc.close(); } }
</script></head><body>bench publisher</body></html>"""


def chromium_binary() -> str | None:
    """The Debian ``chromium`` (or another on PATH), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserPublisher:
    """One headless Chromium with the bench page loaded (module doc). Loop thread."""

    def __init__(self, binary: str, flags: Sequence[str] = ()) -> None:
        self.binary = binary
        self.flags = (*FLAGS, *flags)
        self.pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._profile: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)

    async def start(self) -> None:
        """Serve the page, start the browser, open the page. Cancellation: call close()."""
        app = web.Application()
        app.router.add_get("/", lambda _r: web.Response(text=_PAGE, content_type="text/html"))
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self._profile = tempfile.mkdtemp(prefix="bench-chromium-")
        self._proc = await asyncio.create_subprocess_exec(
            self.binary,
            *self.flags,
            f"--user-data-dir={self._profile}",
            "about:blank",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self._proc.pid
        active = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        # Chromium says nothing when it is ready but writes this file: poll it.
        while not active.exists() or len(active.read_text().split()) < 2:
            if time.monotonic() > deadline or self._proc.returncode is not None:
                raise RuntimeError("Chromium did not start")
            await asyncio.sleep(0.1)
        devtools = int(active.read_text().split()[0])
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{devtools}/json/list") as response:
            pages = [t for t in await response.json() if t["type"] == "page"]
        self._ws = await self._http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self._call("Page.navigate", url=f"http://127.0.0.1:{port}/")
        # The page's script is defined once it has loaded: poll for it.
        while await self.evaluate("typeof publish") != "function":  # noqa: ASYNC110
            await asyncio.sleep(0.1)

    async def _call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None
        ident = next(self._ids)
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads((await self._ws.receive(timeout=60)).data)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (a promise is awaited); a thrown error raises."""
        result = await self._call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def close(self) -> None:
        """Stop the browser (its process group only) and the page server; idempotent."""
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                await self._proc.wait()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None
