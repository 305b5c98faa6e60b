"""The aiohttp application: routes, and each resource's startup and cleanup.

:func:`create_app` first checks the aiortc adapter (:func:`whip.rtc.compat.check_internals`;
an upgraded stack refuses to start), then builds the routes; nothing is opened until the
app starts. Every resource is its own cleanup context, entered in this order and exited
in reverse; aiohttp exits only the ones that were entered, so a failure between opening
the timeline and serving still closes the timeline (its writer thread and the data-dir
lock), and collects the errors of every exit instead of stopping at the first:

1. :func:`_rtc_process_hooks`: the process-wide aiortc hook
   (:func:`whip.rtc.rate_counter.compact_rate_counters`; idempotent, nothing to undo).
2. :func:`_timeline`: open the timeline (recovery, off the loop); cleanup flushes and
   closes it.
3. :func:`_sessions`: the session manager and the metrics collector; cleanup closes every
   live session (``session_closed`` reason ``shutdown``, durable) before the timeline
   closes.
4. :func:`_gc_policy`: :mod:`whip.gcpolicy` (``server.gc_young_threshold``,
   ``server.gc_freeze``); cleanup unfreezes the heap and restores the threshold.

Each exit logs its own failure (one line) and re-raises it for aiohttp to collect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from registry.timeline import Timeline, TimelineConfig
from whip import metrics
from whip.appkeys import (
    AUTH_KEY,
    CONFIG_KEY,
    LIMITER_KEY,
    SEAMS_KEY,
    SESSIONS_KEY,
    TIMELINE_KEY,
)
from whip.auth import Authenticator
from whip.config import Config
from whip.errors import NotReadyError
from whip.gcpolicy import freeze_startup_heap, set_young_threshold
from whip.middleware import error_middleware
from whip.ratelimit import RequestLimiter
from whip.routes_api import add_api_routes
from whip.routes_whip import add_routes
from whip.rtc.compat import check_internals
from whip.rtc.rate_counter import compact_rate_counters
from whip.session_manager import SessionManager, SessionSeams

logger = logging.getLogger(__name__)


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


async def _rtc_process_hooks(app: web.Application) -> AsyncIterator[None]:
    compact_rate_counters()
    yield


async def _timeline(app: web.Application) -> AsyncIterator[None]:
    """Cancellation: an open cancelled half-way finishes on its thread; the lock it
    took is released when the process exits."""
    timeline = await asyncio.to_thread(Timeline.open, timeline_config(app[CONFIG_KEY]))
    app[TIMELINE_KEY] = timeline
    yield
    try:
        await timeline.aclose()
    except Exception as exc:
        logger.error("cleanup: the timeline did not close cleanly: %r", exc)
        raise


async def _sessions(app: web.Application) -> AsyncIterator[None]:
    manager = SessionManager(app[CONFIG_KEY], app[TIMELINE_KEY], app[SEAMS_KEY])
    app[SESSIONS_KEY] = manager
    metrics.install(app, manager, app[TIMELINE_KEY])
    yield
    try:
        await manager.shutdown()
    except Exception as exc:
        logger.error("cleanup: session shutdown failed: %r", exc)
        raise


async def _gc_policy(app: web.Application) -> AsyncIterator[None]:
    server = app[CONFIG_KEY].server
    restore_threshold = set_young_threshold(server.gc_young_threshold)
    unfreeze = freeze_startup_heap() if server.gc_freeze else None
    yield
    if unfreeze is not None:
        unfreeze()
    restore_threshold()


def create_app(config: Config, *, seams: SessionSeams | None = None) -> web.Application:
    """Build the application; nothing is opened until it starts (module doc).

    Raises :class:`whip.rtc.compat.IncompatibleAiortcError` first when the installed
    aiortc stack is not the one the adapter was verified against (or an internal moved).
    ``seams``: what the session manager uses instead of its production parts (tests).

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
    app[SEAMS_KEY] = seams or SessionSeams()
    auth = Authenticator.from_config(config)
    app[AUTH_KEY] = auth
    app[LIMITER_KEY] = RequestLimiter(limits, auth)
    for context in (_rtc_process_hooks, _timeline, _sessions, _gc_policy):
        app.cleanup_ctx.append(context)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics.metrics)
    add_routes(app)
    add_api_routes(app)
    return app
