"""Webhook receivers for tests: real servers on 127.0.0.1, port 0, each path a behaviour.

:class:`Receivers` is one aiohttp app whose paths behave as a receiver would:

- ``/ok/{name}``: verifies each request with the ``standardwebhooks`` package (the secret
  registered for ``name``), records it (:class:`Delivery`), answers 204. Its behaviour
  can be switched at run time (:attr:`Endpoint.mode`): ``"ok"`` or ``"down"`` (503 after
  verifying).
- ``/flaky/{name}``: as ``/ok`` for the first ``accept_first`` requests, then 503 until it
  refused ``refuse`` requests, then as ``/ok`` again: a down period driven by what it saw,
  not by a clock.
- ``/gone``: 410. ``/redirect``: 307 to ``/target`` (which counts what reaches it).
- ``/huge``: 200 and a 100 MB body, counting the bytes it managed to write.

:class:`RawReceiver` is a bare TCP server for what aiohttp would not do: ``"hang"`` reads
the request and never answers; ``"trickle"`` answers 200 and a chunked body of one byte
every 20 ms forever. Both count connections and the ones the client closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks.webhooks import Webhook

from whip.webhooks.config import WebhookConfig, parse_webhooks

HUGE_BODY_BYTES = 100 * 1024 * 1024


def retrying_hook(url: str, secret: str, **extra: object) -> WebhookConfig:
    """A webhook named ``hook`` wanting ``stream_warning``, retrying fast (0.05-0.2 s)."""
    entry = {"name": "hook", "url": url, "secret": secret, "events": ["stream_warning"]}
    (webhook,) = parse_webhooks([{**entry, "retry_min_s": 0.05, "retry_max_s": 0.2, **extra}])
    return webhook


@dataclass(frozen=True, slots=True)
class Delivery:
    """One request a receiver accepted (verified)."""

    msg_id: str
    payload: dict[str, Any]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when the request was verified (hand-over timings)."""


@dataclass(slots=True)
class Endpoint:
    """What one named receiver path saw."""

    secret: str
    mode: Literal["ok", "down"] = "ok"
    accept_first: int = 0
    refuse: int = 0
    delivered: list[Delivery] = field(default_factory=list)
    refused: list[Delivery] = field(default_factory=list)
    requests: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def first_ids(self) -> list[str]:
        """Accepted ids, each at its first acceptance, in that order."""
        seen: dict[str, None] = {}
        for d in self.delivered:
            seen.setdefault(d.msg_id, None)
        return list(seen)


class Receivers:
    """The aiohttp receiver app (module doc)."""

    def __init__(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        self.gone_hits = 0
        self.target_hits = 0
        self.redirect_hits = 0
        self.huge_written: list[int] = []
        self._server: TestServer | None = None
        app = web.Application()
        app.router.add_post("/ok/{name}", self._ok)
        app.router.add_post("/flaky/{name}", self._flaky)
        app.router.add_post("/gone", self._gone)
        app.router.add_post("/redirect", self._redirect)
        app.router.add_route("*", "/target", self._target)
        app.router.add_post("/huge", self._huge)
        self._app = app

    def add(self, name: str, secret: str, **behaviour: Any) -> Endpoint:
        endpoint = Endpoint(secret, **behaviour)
        self.endpoints[name] = endpoint
        return endpoint

    async def start(self) -> None:
        self._server = TestServer(self._app, host="127.0.0.1")
        await self._server.start_server()

    def url(self, path: str) -> str:
        assert self._server is not None
        return str(self._server.make_url(path))

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()

    async def _verified(self, request: web.Request, endpoint: Endpoint) -> Delivery:
        body = await request.read()
        payload = Webhook(endpoint.secret).verify(body, dict(request.headers))
        assert isinstance(payload, dict)
        return Delivery(request.headers["webhook-id"], payload, body)

    async def _ok(self, request: web.Request) -> web.StreamResponse:
        endpoint = self.endpoints[request.match_info["name"]]
        endpoint.requests += 1
        delivery = await self._verified(request, endpoint)
        if endpoint.mode == "down":
            endpoint.refused.append(delivery)
            endpoint.changed.set()
            return web.Response(status=503, text="down for maintenance")
        endpoint.delivered.append(delivery)
        endpoint.changed.set()
        return web.Response(status=204)

    async def _flaky(self, request: web.Request) -> web.StreamResponse:
        endpoint = self.endpoints[request.match_info["name"]]
        endpoint.requests += 1
        delivery = await self._verified(request, endpoint)
        down = len(endpoint.delivered) >= endpoint.accept_first
        if down and len(endpoint.refused) < endpoint.refuse:
            endpoint.refused.append(delivery)
            endpoint.changed.set()
            return web.Response(status=503, text="down")
        endpoint.delivered.append(delivery)
        endpoint.changed.set()
        return web.Response(status=200, text="thanks")

    async def _gone(self, request: web.Request) -> web.StreamResponse:
        self.gone_hits += 1
        return web.Response(status=410)

    async def _redirect(self, request: web.Request) -> web.StreamResponse:
        self.redirect_hits += 1
        raise web.HTTPTemporaryRedirect(self.url("/target"))

    async def _target(self, request: web.Request) -> web.StreamResponse:
        self.target_hits += 1
        return web.Response(status=204)

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200)
        response.content_length = HUGE_BODY_BYTES
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        written = 0
        try:
            while written < HUGE_BODY_BYTES:
                await response.write(chunk)
                written += len(chunk)
        except (ConnectionError, RuntimeError):
            pass  # the client closed: what it cost is ``written``
        finally:
            self.huge_written.append(written)
        return response


class RawReceiver:
    """A bare TCP receiver that hangs or trickles (module doc)."""

    def __init__(self, behaviour: Literal["hang", "trickle"]) -> None:
        self.behaviour = behaviour
        self.connections = 0
        self.requests = 0
        self.closed_by_client = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            if self.behaviour == "hang":
                while await reader.read(65536):
                    pass  # keep reading; never answer
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                while True:
                    writer.write(b"1\r\nx\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.02)  # the trickle itself, not a wait for state
            self.closed_by_client += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client += 1
        finally:
            writer.close()
            self._handlers.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
