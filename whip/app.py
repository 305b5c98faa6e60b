"""The aiohttp application: state keys, startup and cleanup, routes.

Startup order: open the timeline (recovery, off the loop). Cleanup runs in reverse and
collects failures instead of swallowing them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from registry.timeline import Timeline, TimelineConfig
from whip.middleware import error_middleware

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What the app needs to start (the CLI and tests build this)."""

    data_dir: Path
    stream_ttl_s: float = 0.0


SETTINGS_KEY = web.AppKey("settings", ServerSettings)
TIMELINE_KEY = web.AppKey("timeline", Timeline)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: recovery done and the WAL writable."""
    timeline = request.app.get(TIMELINE_KEY)
    if timeline is None or not timeline.ready:
        broken = timeline.wal.broken if timeline is not None else None
        detail = f"wal broken: {broken}" if broken is not None else "not recovered"
        return web.json_response({"error": {"code": "not_ready", "message": detail}}, status=503)
    body: dict[str, object] = {"status": "ready", "last_seq": timeline.snapshot.last_seq}
    report = timeline.recovery
    if report is not None and report.corruption is not None:
        body["corruption"] = str(report.corruption)
        body["quarantined"] = report.quarantined
    return web.json_response(body)


async def _timeline_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS_KEY]
    config = TimelineConfig(settings.data_dir, stream_ttl_s=settings.stream_ttl_s)
    timeline = await asyncio.to_thread(Timeline.open, config)
    app[TIMELINE_KEY] = timeline
    yield
    await timeline.aclose()


def create_app(settings: ServerSettings) -> web.Application:
    """Build the application; nothing is opened until it starts."""
    app = web.Application(middlewares=[error_middleware], client_max_size=64 * 1024)
    app[SETTINGS_KEY] = settings
    app.cleanup_ctx.append(_timeline_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
