"""A WHIP front on 127.0.0.1 that rewrites the publisher's offer on its way to a real
server: a publisher whose SDP says what OBS's says, whatever its encoder makes.

OBS writes ``profile-level-id=42e01f`` for every H.264 encoder; FFmpeg's WHIP muxer
writes the real one. Behind this front, FFmpeg's muxer offers what OBS would. The front
forwards ``POST`` (the offer through ``rewrite``) and every other method on the path
(the muxer's ``DELETE`` of its session URL, trickle ``PATCH``) unchanged, and answers
with the server's status, body and headers; the ``Location`` stays relative, so the
publisher's later requests come back through the front too.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

Rewrite = Callable[[str], str]
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "host"})


def profile_level_id(value: str) -> Rewrite:
    """A rewrite that makes every H.264 ``profile-level-id`` of an offer ``value``
    (``42e01f``: what OBS writes)."""

    def rewrite(sdp: str) -> str:
        return re.sub(r"profile-level-id=[0-9A-Fa-f]{6}", f"profile-level-id={value}", sdp)

    return rewrite


async def start_offer_rewrite(target: TestServer, rewrite: Rewrite) -> TestServer:
    """A started front for ``target`` (close it with ``await front.close()``)."""

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        if request.method == "POST" and request.content_type == "application/sdp":
            body = rewrite(body.decode()).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                request.method, target.make_url(request.path_qs), data=body, headers=headers
            ) as answer,
        ):
            payload = await answer.read()
            out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_HEADERS}
            return web.Response(status=answer.status, body=payload, headers=out)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    front = TestServer(app, host="127.0.0.1")
    await front.start_server()
    return front
