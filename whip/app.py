"""The aiohttp application: state keys, startup and cleanup, routes.

Startup order: the process-wide aiortc hook of :func:`whip.rtc.rate_counter.compact_rate_counters`,
open the timeline (recovery, off the loop), the session manager, then the GC policy of
:mod:`whip.gcpolicy` (``server.gc_young_threshold``, ``server.gc_freeze``). Cleanup runs
in reverse: the heap is unfrozen and the threshold restored, live sessions are closed
(``session_closed`` reason ``shutdown``, durable), then the timeline is flushed and
closed. Cleanup failures are collected and logged, not swallowed silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from registry.timeline import Timeline, TimelineConfig
from whip import metrics
from whip.auth import Authenticator
from whip.config import Config
from whip.errors import NotReadyError
from whip.gcpolicy import freeze_startup_heap, set_young_threshold
from whip.middleware import error_middleware
from whip.ratelimit import LIMITER_KEY, RequestLimiter
from whip.routes_api import add_api_routes
from whip.routes_whip import AUTH_KEY, SESSIONS_KEY, add_routes
from whip.rtc.compat import check_internals
from whip.rtc.rate_counter import compact_rate_counters
from whip.sessions import SessionManager

logger = logging.getLogger(__name__)

CONFIG_KEY = web.AppKey("config", Config)
TIMELINE_KEY = web.AppKey("timeline", Timeline)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: recovery done and the WAL writable."""
    timeline = request.app.get(TIMELINE_KEY)
    if timeline is None or not timeline.ready:
        broken = timeline.wal.broken if timeline is not None else None
        raise NotReadyError(f"wal broken: {broken}" if broken is not None else "not recovered")
    body: dict[str, object] = {"status": "ready", "last_seq": timeline.snapshot.last_seq}
    report = timeline.recovery
    if report is not None and report.corruption is not None:
        body["corruption"] = str(report.corruption)
        body["quarantined"] = report.quarantined
    return web.json_response(body)


def timeline_config(config: Config) -> TimelineConfig:
    """The registry's view of the configuration."""
    wal = config.wal
    return TimelineConfig(
        data_dir=config.server.data_dir,
        segment_bytes=wal.segment_bytes,
        max_record_bytes=wal.max_record_bytes,
        queue_capacity=wal.queue_capacity,
        tail_events=wal.tail_events,
        warm_runs=wal.warm_runs,
        deleted_retention=wal.deleted_retention,
        stream_ttl_s=config.limits.stream_ttl_s,
        on_corruption=wal.on_corruption,
    )


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    compact_rate_counters()
    timeline = await asyncio.to_thread(Timeline.open, timeline_config(config))
    app[TIMELINE_KEY] = timeline
    manager = SessionManager(config, timeline)
    app[SESSIONS_KEY] = manager
    metrics.install(app, manager, timeline)
    restore_threshold = set_young_threshold(config.server.gc_young_threshold)
    unfreeze = freeze_startup_heap() if config.server.gc_freeze else None
    yield
    if unfreeze is not None:
        unfreeze()
    restore_threshold()
    errors: list[BaseException] = []
    try:
        await manager.shutdown()
    except Exception as exc:
        errors.append(exc)
    try:
        await timeline.aclose()
    except Exception as exc:
        errors.append(exc)
    for error in errors:
        logger.error("cleanup failed: %r", error)


def create_app(config: Config) -> web.Application:
    """Build the application; nothing is opened until it starts.

    Raises :class:`whip.rtc.compat.IncompatibleAiortcError` first when the installed
    aiortc stack is not the one the adapter was verified against (or an internal moved).

    Connection limits (``handler_args``): the request line and each header field are
    capped at ``limits.max_header_bytes`` (aiohttp itself answers 400, plain text, before
    any middleware runs); ``limits.keepalive_timeout_s`` closes idle connections and
    connections that trickle their headers. Rate limits and the body deadline:
    :mod:`whip.ratelimit`.
    """
    check_internals()
    limits = config.limits
    handler_args = {
        "max_line_size": limits.max_header_bytes,
        "max_field_size": limits.max_header_bytes,
        "keepalive_timeout": limits.keepalive_timeout_s,
    }
    app = web.Application(
        middlewares=[error_middleware], client_max_size=64 * 1024, handler_args=handler_args
    )
    app[CONFIG_KEY] = config
    auth = Authenticator.from_config(config)
    app[AUTH_KEY] = auth
    app[LIMITER_KEY] = RequestLimiter(limits, auth)
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics.metrics)
    add_routes(app)
    add_api_routes(app)
    return app
