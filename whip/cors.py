"""CORS for the WHIP routes (the Fetch standard's CORS protocol, RFC 9725 section 4.8).

Browsers publish from other origins. A cross-origin script reads only the CORS-safelisted
response headers unless the answer exposes more, so every WHIP answer (POST, PATCH,
DELETE, OPTIONS, and the errors) exposes :data:`EXPOSED`: ``Location``, ``ETag``,
``Link``, ``X-Run-Id``, ``Accept-Post``/``Accept-Patch``, ``Retry-After`` on refusals,
and ``Access-Control-Allow-Methods`` (Eyevinn's whip-web-client decides whether to
trickle from the OPTIONS answer's allowed methods). Preflights allow
:data:`ALLOW_HEADERS`, which include ``If-Match`` and ``ETag`` (that client sends its tag
in an ``ETag`` request header). Applied to successful WHIP answers by the routes and to
WHIP error answers by the error middleware (the REST API is for operators' tools and has
no CORS)."""

from __future__ import annotations

from aiohttp import web

EXPOSED = (
    "Location, ETag, Link, X-Run-Id, Accept-Post, Accept-Patch, Retry-After, "
    "Access-Control-Allow-Methods"
)
ALLOW_HEADERS = "Authorization, Content-Type, If-Match, ETag"


def add_cors(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Allow the caller's origin to read the answer and the exposed headers."""
    response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "*")
    response.headers["Access-Control-Expose-Headers"] = EXPOSED
    response.headers["Vary"] = "Origin"
    return response


def is_whip_path(path: str) -> bool:
    """``/whip`` and everything under it."""
    return path == "/whip" or path.startswith("/whip/")
