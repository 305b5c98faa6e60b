"""The other side of authentication for tests: signing keys, JWT minting, a JWKS server
and an auth hook server, all real and on 127.0.0.1.

- :class:`SigningKey`, :func:`jwks_document`: the benches' own
  (``bench/support/jwt_keys.py``): generated keys, PyJWT-minted tokens, a JWKS.
- :class:`JwksServer`: serves ``{"keys": [...]}`` from a list the test edits, counts GETs,
  and can answer 503 (``down``) to stand for an unreachable key set.
- :class:`HookServer`: an auth hook whose answer is chosen by the token (``behaviours``:
  admit, operator, refuse, forbid, hang, garbage, bad name or role, redirect, huge, error;
  any other token is refused with 401); it records every request body it got, and
  ``hang`` waits on an event released at close.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.support.jwt_keys import AUDIENCE, ISSUER, SigningKey, jwks_document


class JwksServer:
    """A JWKS on loopback (module doc)."""

    def __init__(self, keys: list[SigningKey]) -> None:
        self.keys = keys
        self.gets = 0
        self.down = False
        app = web.Application()
        app.router.add_get("/jwks.json", self._serve)
        self.server = TestServer(app, host="127.0.0.1")

    async def _serve(self, request: web.Request) -> web.Response:
        self.gets += 1
        if self.down:
            return web.Response(status=503)
        return web.Response(body=jwks_document(*self.keys), content_type="application/json")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/jwks.json"))

    async def start(self) -> JwksServer:
        await self.server.start_server()
        return self

    async def close(self) -> None:
        await self.server.close()


class HookServer:
    """An auth hook on loopback (module doc). The token names the behaviour: its text
    up to the first ``.`` (``admit.1``, ``refuse.x``, ...)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/auth", self._answer)
        app.router.add_post("/elsewhere", self._elsewhere)
        self.elsewhere_calls = 0
        self.server = TestServer(app, host="127.0.0.1")

    def calls(self, token: str) -> int:
        """How many requests the hook got for ``token``."""
        return sum(1 for body in self.bodies if body.get("token") == token)

    async def _elsewhere(self, request: web.Request) -> web.Response:
        self.elsewhere_calls += 1
        return web.json_response({"principal": "redirected", "role": "operator"})

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        kind = str(body.get("token", "")).split(".")[0]
        if kind == "admit":
            return web.json_response({"principal": "hook-studio", "role": "publisher"})
        if kind == "operator":
            return web.json_response({"principal": "hook-ops", "role": "operator"})
        if kind == "refuse":
            return web.json_response({"error": "no"}, status=401)
        if kind == "forbid":
            return web.json_response({"error": "not this"}, status=403)
        if kind == "hang":
            await self.release.wait()
            return web.json_response({"principal": "late", "role": "operator"})
        if kind == "garbage":
            return web.Response(body=b"<html>ok</html>", content_type="text/html")
        if kind == "badname":
            return web.json_response({"principal": "../etc", "role": "publisher"})
        if kind == "badrole":
            return web.json_response({"principal": "hook-x", "role": "admin"})
        if kind == "redirect":
            raise web.HTTPFound("/elsewhere")
        if kind == "huge":
            filler = "x" * (1 << 20)
            return web.json_response({"principal": "hook-big", "role": "operator", "f": filler})
        if kind == "error":
            return web.Response(status=500)
        return web.json_response({"error": "unknown token"}, status=401)

    @property
    def url(self) -> str:
        return str(self.server.make_url("/auth"))

    async def start(self) -> HookServer:
        await self.server.start_server()
        return self

    async def close(self) -> None:
        self.release.set()
        await self.server.close()


__all__ = [
    "AUDIENCE",
    "ISSUER",
    "HookServer",
    "JwksServer",
    "SigningKey",
    "jwks_document",
]
