"""The operator dashboard: ``GET /`` and ``GET /ui/...``, static files from the package.

Rules:

- **What is served.** Exactly the files of ``whip/ui/`` named in :data:`UI_FILES`, read
  once when the routes are added (so a request never touches the filesystem and no path
  from a request can reach it). ``GET /`` and ``GET /ui/`` answer ``index.html``; any
  other name under ``/ui/`` is 404 in the API's JSON error shape. No build step, no CDN:
  the page and its script and style are all here, so the dashboard works offline.
- **What the page may do.** Every answer carries :data:`CONTENT_SECURITY_POLICY`: scripts
  only from this origin (no inline script, no ``eval``), styles only from this origin,
  requests only to this origin, images and media also from ``blob:`` (thumbnails and
  recordings are fetched with the bearer token and shown through blob URLs, since an
  ``<img src>`` cannot carry an ``Authorization`` header), no frames, no plug-ins, no
  form posts. Also ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``
  and ``X-Frame-Options: DENY``.
- **Caching.** Each file has a strong ``ETag`` (a hash of its bytes) and
  ``Cache-Control: no-cache``: a browser keeps its copy and revalidates it on every
  load (304 when unchanged), so an upgraded server is never shown with a stale script.
- **Authentication.** None here: the files hold no data. The page reads everything
  through the public REST API (``/v1``) with the operator's bearer token, and asks for
  one when the API answers 401 (``whip/ui/app.js`` says how it keeps it).
"""

from __future__ import annotations

import hashlib
import importlib.resources
from dataclasses import dataclass

from aiohttp import web

from whip.appkeys import UI_FILES_KEY
from whip.errors import NotFoundError

UI_FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "app.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
"""The dashboard's files (``whip/ui/``) and their media types (charset utf-8)."""

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' blob:",
        "media-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
"""The page's Content-Security-Policy (module rules)."""

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True, slots=True)
class UiFile:
    """One dashboard file, loaded."""

    body: bytes
    content_type: str
    etag: str
    """Quoted, strong."""


def load_ui_files() -> dict[str, UiFile]:
    """The files of :data:`UI_FILES` from the installed package."""
    root = importlib.resources.files("whip").joinpath("ui")
    files: dict[str, UiFile] = {}
    for name, content_type in UI_FILES.items():
        body = root.joinpath(name).read_bytes()
        digest = hashlib.sha256(body).hexdigest()[:32]
        files[name] = UiFile(body, content_type, f'"{digest}"')
    return files


def _answer(request: web.Request, name: str) -> web.Response:
    file = request.app[UI_FILES_KEY].get(name)
    if file is None:
        raise NotFoundError("dashboard file")
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache", "ETag": file.etag}
    if file.etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    return web.Response(
        body=file.body, content_type=file.content_type, charset="utf-8", headers=headers
    )


async def index(request: web.Request) -> web.Response:
    """``GET /`` and ``GET /ui/``: the dashboard page."""
    return _answer(request, "index.html")


async def asset(request: web.Request) -> web.Response:
    """``GET /ui/{name}``: one of the page's files; anything else is 404."""
    return _answer(request, request.match_info["name"])


def add_ui_routes(app: web.Application) -> None:
    """Load the dashboard's files and register ``/``, ``/ui/`` and ``/ui/{name}``."""
    app[UI_FILES_KEY] = load_ui_files()
    app.router.add_get("/", index, allow_head=False)
    app.router.add_get("/ui/", index, allow_head=False)
    app.router.add_get("/ui/{name}", asset, allow_head=False)
