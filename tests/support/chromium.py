"""Headless Chromium for tests: a real browser publisher, driven over the DevTools protocol.

Rules:

- **Where Chromium comes from.** The Debian package ``chromium`` (``make test`` installs
  it when it runs as root: ``.ci/test-packages``). :func:`require_chromium` skips a test
  with a message saying how to get it when it is missing, except under ``CI=true``,
  where a missing browser fails the test: CI must never pass by skipping.
- **Why the DevTools protocol and not chromedriver.** The tests run on an event loop that
  must not block (``tests/conftest.py``'s ``no_blocking_on_loop``); Selenium's client is
  blocking and would need a thread per call. The DevTools protocol is one WebSocket,
  spoken here with aiohttp (already a dependency): no extra package, no chromedriver
  process, and the browser's console lines and uncaught exceptions come along as events
  (:attr:`ChromiumPage.console`), which is what a failing test needs to show.
- **Processes.** :meth:`Chromium.start` runs one browser in its own process group with a
  fresh ``--user-data-dir`` and records its PID (:attr:`Chromium.pid`);
  :meth:`Chromium.stop` always ends it and every child it made (SIGTERM to that process
  group, then SIGKILL after a bound), and is idempotent. The ``chromium`` fixture in
  ``tests/conftest.py`` stops every browser a test started, whatever the test did.
- **The page.** :class:`PublishPage` serves, from its own aiohttp server on 127.0.0.1,
  a page with ``whip_publish.js`` (its header comment is the page's contract):
  ``whipPublish(endpoint, options)`` publishes the fake camera (and microphone) to a
  WHIP endpoint from JavaScript, ``window.whip`` holds the state the test reads.
  The page's origin differs from the WHIP server's, as a browser publisher's does, so
  the server's CORS answers are part of what is exercised.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually

BASE_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
"""Flags every test browser starts with (the DevTools port is chosen by Chromium and read
back from ``DevToolsActivePort`` in the profile directory)."""

UDP_BLOCKED_FLAGS = ("--webrtc-ip-handling-policy=disable_non_proxied_udp",)
"""WebRTC without UDP: the offer carries no UDP candidates and ICE runs over TCP only."""

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 30.0

_SCRIPT = Path(__file__).with_name("whip_publish.js")
_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>whip publish</title>
<script src="/whip_publish.js"></script></head>
<body><p>whip-ingest test publisher</p></body></html>
"""


def chromium_binary() -> str | None:
    """The Chromium executable on ``PATH``, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """The Chromium executable; skips the test when there is none (fails under CI)."""
    binary = chromium_binary()
    if binary is not None:
        return binary
    message = (
        "headless Chromium is not installed: `make test` run as root installs the Debian "
        "package `chromium` (.ci/test-packages), or run `apt-get install chromium`"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: browser tests never skip)")
    pytest.skip(message)


class ChromiumError(RuntimeError):
    """The browser refused a DevTools call, or the page's JavaScript threw."""


class ChromiumPage:
    """One page target of a browser, over its own DevTools WebSocket. Loop thread."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.console: list[str] = []
        """Console lines and uncaught exceptions of the page, in arrival order."""
        self._reader = asyncio.create_task(self._read(), name="chromium-devtools-reader")

    async def _read(self) -> None:
        """Deliver call results and record console events until the socket closes.

        Cancellation: the calls still waiting fail with :class:`ChromiumError`.
        """
        try:
            async for message in self._ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                body = json.loads(message.data)
                call = self._calls.pop(body["id"], None) if "id" in body else None
                if call is not None and not call.done():
                    call.set_result(body)
                elif body.get("method") == "Runtime.consoleAPICalled":
                    args = body["params"].get("args", [])
                    text = " ".join(str(a.get("value", a.get("description", ""))) for a in args)
                    self.console.append(f"{body['params'].get('type')}: {text}")
                elif body.get("method") == "Runtime.exceptionThrown":
                    details = body["params"]["exceptionDetails"]
                    thrown = details.get("exception", {}).get("description", details.get("text"))
                    self.console.append(f"exception: {thrown}")
        finally:
            for call in self._calls.values():
                if not call.done():
                    call.set_exception(ChromiumError("the DevTools connection closed"))
            self._calls.clear()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its ``result``.

        Cancellation: the answer, when it comes, is dropped.
        """
        ident = next(self._ids)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[ident] = answer
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                body = await answer
        finally:
            self._calls.pop(ident, None)
        if "error" in body:
            raise ChromiumError(f"{method}: {body['error']}")
        result: dict[str, Any] = body.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (a promise is awaited), as JSON data;
        an exception in the page raises :class:`ChromiumError` with its description."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            thrown = details.get("exception", {}).get("description", details.get("text"))
            raise ChromiumError(f"{expression[:80]!r} threw: {thrown}; console: {self.console}")
        return result["result"].get("value")

    async def goto(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        """Navigate to ``url`` and wait until the ``ready`` expression is true."""
        await self.call("Page.navigate", url=url)

        async def loaded() -> bool:
            return bool(await self.evaluate(ready))

        await eventually(loaded, within=START_TIMEOUT_S, awaiting=f"{url} loaded", every=0.05)

    async def close(self) -> None:
        """Close the socket and stop the reader (idempotent)."""
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Chromium:
    """One headless browser process (module rules); started with :meth:`start`."""

    def __init__(self, binary: str, flags: Sequence[str] = ()) -> None:
        self.binary = binary
        self.flags = (*BASE_FLAGS, *flags)
        self.pid: int | None = None
        """The browser's PID (its process group id too), once started."""
        self._process: asyncio.subprocess.Process | None = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._pages: list[ChromiumPage] = []

    @property
    def log_path(self) -> Path | None:
        """The browser's stderr (kept in the profile directory until :meth:`stop`)."""
        return None if self._profile is None else Path(self._profile.name, "chromium.log")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the browser's stderr, for a failure message."""
        path = self.log_path
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    async def start(self) -> ChromiumPage:
        """Start the browser and connect to its first page.

        Cancellation: the browser is stopped.
        """
        self._profile = tempfile.TemporaryDirectory(prefix="whip-chromium-")
        profile = Path(self._profile.name)
        log_path = profile / "chromium.log"
        with log_path.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                self.binary,
                *self.flags,
                f"--user-data-dir={profile / 'profile'}",
                "about:blank",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.pid = self._process.pid
        try:
            port_file = profile / "profile" / "DevToolsActivePort"

            def devtools_port() -> int | None:
                if self._process is not None and self._process.returncode is not None:
                    raise ChromiumError(f"chromium exited at start:\n{self.log_tail()}")
                # "<port>\n<browser target path>", written once the port is open.
                lines = port_file.read_text().split("\n") if port_file.exists() else []
                complete = len(lines) >= 2 and lines[0].isdigit() and lines[1]
                return int(lines[0]) if complete else None

            port = await eventually(
                devtools_port,
                within=START_TIMEOUT_S,
                awaiting=lambda: f"chromium's DevTools port; log:\n{self.log_tail()}",
                every=0.05,
            )
            self._http = aiohttp.ClientSession()
            return await self._first_page(port)
        except BaseException:
            await self.stop()
            raise

    async def _first_page(self, port: int) -> ChromiumPage:
        """Connect to the page target the browser opened at start."""
        assert self._http is not None
        http = self._http

        async def page_url() -> str | None:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            for target in targets:
                if target.get("type") == "page":
                    url: str = target["webSocketDebuggerUrl"]
                    return url
            return None

        url = await eventually(page_url, within=START_TIMEOUT_S, awaiting="a page target")
        ws = await http.ws_connect(url, max_msg_size=0)
        page = ChromiumPage(ws)
        self._pages.append(page)
        await page.call("Runtime.enable")
        await page.call("Page.enable")
        return page

    async def stop(self) -> None:
        """End the browser and its children; remove its profile (idempotent).

        Cancellation: the process group is killed before the cancellation propagates.
        """
        pages, self._pages = self._pages, []
        for page in pages:
            with contextlib.suppress(Exception):
                await page.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        process, self._process = self._process, None
        if process is not None:
            try:
                if process.returncode is None:
                    self._signal_group(signal.SIGTERM)
                    try:
                        async with asyncio.timeout(STOP_TIMEOUT_S):
                            await process.wait()
                    except TimeoutError:
                        self._signal_group(signal.SIGKILL)
                        await process.wait()
            finally:
                self._signal_group(signal.SIGKILL)  # children that outlived the browser
        if self._profile is not None:
            self._profile.cleanup()
            self._profile = None

    def _signal_group(self, signum: int) -> None:
        """Signal the browser's own process group (recorded PID), if it still exists."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)


class PublishPage:
    """The publisher page (module rules) on its own server at 127.0.0.1, port 0."""

    def __init__(self) -> None:
        self._script_bytes = _SCRIPT.read_bytes()
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/whip_publish.js", self._script)
        self.server = TestServer(app, host="127.0.0.1")

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text=_PAGE, content_type="text/html")

    async def _script(self, request: web.Request) -> web.Response:
        return web.Response(body=self._script_bytes, content_type="application/javascript")

    @property
    def url(self) -> str:
        """The page's URL (the server must be started)."""
        return str(self.server.make_url("/"))

    async def start(self) -> None:
        """Start serving the page."""
        await self.server.start_server()

    async def close(self) -> None:
        """Stop serving the page (idempotent)."""
        await self.server.close()


async def open_publisher(browser: Chromium, page_server: PublishPage) -> ChromiumPage:
    """Start ``browser`` and load the publisher page in it (``whipPublish`` defined)."""
    page = await browser.start()
    await page.goto(page_server.url, ready="typeof whipPublish === 'function'")
    return page


__all__ = [
    "BASE_FLAGS",
    "UDP_BLOCKED_FLAGS",
    "Chromium",
    "ChromiumError",
    "ChromiumPage",
    "PublishPage",
    "chromium_binary",
    "open_publisher",
    "require_chromium",
]
