"""CORS for the WHIP routes: browsers publish from other origins and must be able to
read ``Location``, ``ETag``, ``Link``, ``X-Run-Id`` and, on refusals, ``Retry-After``.
Applied to successful WHIP answers by the routes and to WHIP error answers by the error
middleware (the REST API is for operators' tools and has no CORS)."""

from __future__ import annotations

from aiohttp import web

EXPOSED = "Location, ETag, Link, X-Run-Id, Accept-Post, Retry-After"


def add_cors(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Allow the caller's origin to read the answer and the exposed headers."""
    response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "*")
    response.headers["Access-Control-Expose-Headers"] = EXPOSED
    response.headers["Vary"] = "Origin"
    return response


def is_whip_path(path: str) -> bool:
    """``/whip`` and everything under it."""
    return path == "/whip" or path.startswith("/whip/")
