"""The aiohttp application: routes, and each resource's startup and cleanup.

:func:`create_app` first checks the aiortc adapter (:func:`whip.rtc.compat.check_internals`;
an upgraded stack refuses to start), then builds the routes; nothing is opened until the
app starts. Every resource is its own cleanup context, entered in this order and exited
in reverse; aiohttp exits only the ones that were entered, so a failure between opening
the timeline and serving still closes the timeline (its writer thread and the data-dir
lock), and collects the errors of every exit instead of stopping at the first:

0. :func:`_auth_clients`: nothing at start; its cleanup, the last, closes the HTTP clients
   of the JWT key set and the auth hook (:mod:`whip.auth`).
1. :func:`_rtc_process_hooks`: the process-wide aiortc hooks
   (:func:`whip.rtc.rate_counter.compact_rate_counters`,
   :func:`whip.rtc.ice_sockets.install_socket_hook`, and for H.265, AV1 and VP9
   :func:`whip.rtc.codec_table.install_video_codecs` and
   :func:`whip.rtc.depayload.install_depayload`; idempotent, nothing to undo).
2. :func:`_ice_sockets`: the ICE sockets: the shared UDP port (``ice.udp_mux``, bound
   here, so a port in use stops the start before the timeline opens:
   :class:`whip.rtc.udp_mux.UdpPortInUseError`) or the per-session sockets' provider;
   cleanup closes the shared sockets after every session closed.
3. :func:`_ice_tcp`: the ICE-TCP port (:mod:`whip.rtc.ice_tcp`; ``ice.tcp_port`` -1: none),
   bound before the timeline opens too (a port that cannot be bound fails the start with
   :class:`whip.rtc.ice_tcp.IceTcpBindError`); cleanup closes it after the sessions (whose
   bound TCP connections close with them).
4. :func:`_timeline`: open the timeline (recovery, off the loop); cleanup flushes and
   closes it. In cluster mode (``cluster.store``) it opens the cluster store instead
   (:mod:`whip.cluster_node`: schema, lease, LISTEN; cleanup drains the group commit and
   leaves the cluster), and ``/v1/nodes`` and the internal session route are added.
5. :func:`_sessions`: the session manager and the metrics collector, after the
   recordings' start-up recovery (:meth:`whip.recordings.Recordings.recover`: unfinished
   segments closed and recorded before any session starts); cleanup closes every live
   session (``session_closed`` reason ``shutdown``, durable) before the timeline closes.
6. :func:`whip.webhooks.service.webhooks_context`: one dispatcher per ``[[webhooks]]``
   entry, in the webhooks' delivery process (a child that follows the WAL; cursors in
   ``<data_dir>/webhooks/cursors.json``), or on the webhooks' own thread with the cursors
   in the cluster store in cluster mode; cleanup stops them before the sessions close.
7. :func:`_gc_policy`: :mod:`whip.gcpolicy` (``server.gc_young_threshold``,
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
    CLUSTER_KEY,
    CONFIG_KEY,
    ICE_SOCKETS_KEY,
    ICE_TCP_KEY,
    LIMITER_KEY,
    SEAMS_KEY,
    SESSIONS_KEY,
    TIMELINE_KEY,
)
from whip.auth import Authenticator
from whip.config import Config, is_loopback
from whip.errors import NotReadyError
from whip.gcpolicy import freeze_startup_heap, set_young_threshold
from whip.middleware import error_middleware
from whip.ratelimit import RequestLimiter
from whip.routes_api import add_api_routes
from whip.routes_ui import add_ui_routes
from whip.routes_whip import add_routes
from whip.rtc.codec_table import install_video_codecs
from whip.rtc.compat import check_internals
from whip.rtc.depayload import install_depayload
from whip.rtc.ice_sockets import install_socket_hook
from whip.rtc.ice_tcp import IceTcpLimits, IceTcpListener
from whip.rtc.rate_counter import compact_rate_counters
from whip.rtc.session_sockets import SessionSockets
from whip.rtc.udp_mux import UdpMux
from whip.session_manager import SessionManager, SessionSeams
from whip.webhooks.routes import add_webhook_routes
from whip.webhooks.service import webhooks_context

logger = logging.getLogger(__name__)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: recovery done and the WAL writable (cluster mode: the node holds its
    lease); ``udp_ports``: the shared ICE port(s) in use (with ``ice.udp_mux``)."""
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is not None:
        if not cluster.ready:
            raise NotReadyError("no lease: the node is fenced or the store is out of reach")
        return web.json_response({"status": "ready", "node": cluster.config.node_id})
    timeline = request.app.get(TIMELINE_KEY)
    if timeline is None or not timeline.ready:
        broken = timeline.wal.broken if timeline is not None else None
        raise NotReadyError(f"wal broken: {broken}" if broken is not None else "not recovered")
    body: dict[str, object] = {"status": "ready", "last_seq": timeline.snapshot.last_seq}
    sockets = request.app.get(ICE_SOCKETS_KEY)
    if isinstance(sockets, UdpMux):
        body["udp_ports"] = [port for _host, port in sockets.ports]
    ice_tcp = request.app.get(ICE_TCP_KEY)
    body["ice_tcp_port"] = ice_tcp.port if ice_tcp is not None else None
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
    install_socket_hook()
    install_video_codecs()
    install_depayload()
    yield


async def _ice_sockets(app: web.Application) -> AsyncIterator[None]:
    """Cancellation: the sockets opened so far are closed."""
    ice = app[CONFIG_KEY].ice
    if not ice.udp_mux:
        app[ICE_SOCKETS_KEY] = SessionSockets(ice.port_min, ice.port_max)
        logger.info(
            "ice: a UDP socket per session, ports %s",
            "any" if ice.port_max == 0 else f"{ice.port_min}..{ice.port_max}",
        )
        yield
        return
    mux = UdpMux(ice.udp_port)
    await mux.start()
    app[ICE_SOCKETS_KEY] = mux
    yield
    await mux.aclose()


async def _timeline(app: web.Application) -> AsyncIterator[None]:
    """Cancellation: an open cancelled half-way finishes on its thread; the lock it
    took is released when the process exits."""
    config = app[CONFIG_KEY]
    if config.cluster.enabled:
        from registry.pg.timeline import ClusterTimeline
        from whip.cluster_node import cluster_timeline_config

        cluster = await ClusterTimeline.open(cluster_timeline_config(config))
        app[CLUSTER_KEY] = cluster
        logger.info(
            "cluster mode: node %s (%s), lease %g s",
            cluster.config.node_id,
            cluster.config.advertise_url,
            cluster.config.lease_s,
        )
        yield
        try:
            await cluster.aclose()
        except Exception as exc:
            logger.error("cleanup: the cluster store did not close cleanly: %r", exc)
            raise
        return
    timeline = await asyncio.to_thread(Timeline.open, timeline_config(config))
    app[TIMELINE_KEY] = timeline
    yield
    try:
        await timeline.aclose()
    except Exception as exc:
        logger.error("cleanup: the timeline did not close cleanly: %r", exc)
        raise


async def _ice_tcp(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    ice = config.ice
    if ice.tcp_port < 0:
        yield
        return
    listener = IceTcpListener(
        IceTcpLimits(
            handshake_timeout_s=ice.tcp_handshake_timeout_s,
            max_connections=ice.tcp_max_connections,
            max_connections_per_address=ice.tcp_max_connections_per_address,
            max_frame_bytes=ice.tcp_max_frame_bytes,
        ),
        public_hosts=config.server.public_hosts,
    )
    # Loopback-only servers keep ICE on loopback; otherwise every interface, as aioice
    # gathers UDP on every interface address.
    host = config.server.host if is_loopback(config.server.host) else None
    await listener.start(host, ice.tcp_port)
    app[ICE_TCP_KEY] = listener
    yield
    try:
        await listener.close()
    except Exception as exc:
        logger.error("cleanup: the ICE-TCP port did not close cleanly: %r", exc)
        raise


async def _sessions(app: web.Application) -> AsyncIterator[None]:
    cluster = app.get(CLUSTER_KEY)
    timeline = cluster if cluster is not None else app[TIMELINE_KEY]
    manager = SessionManager(
        app[CONFIG_KEY],
        timeline,
        app[SEAMS_KEY],
        ice_sockets=app[ICE_SOCKETS_KEY],
        ice_tcp=app.get(ICE_TCP_KEY),
    )
    try:
        await manager.recordings.recover()
    except Exception:  # the recordings are not worth refusing to serve for
        logger.exception("recordings: start-up recovery failed; serving without it")
    app[SESSIONS_KEY] = manager
    if cluster is not None:
        from whip.cluster_node import attach_owner

        attach_owner(cluster, manager)
    metrics.install(app, manager, timeline)
    yield
    try:
        await manager.shutdown()
    except Exception as exc:
        logger.error("cleanup: session shutdown failed: %r", exc)
        raise


async def _auth_clients(app: web.Application) -> AsyncIterator[None]:
    """Nothing at start (the JWKS and the hook are reached on the first token); at
    cleanup, close their HTTP clients."""
    yield
    await app[AUTH_KEY].close()


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
    for context in (
        _auth_clients,
        _rtc_process_hooks,
        _ice_sockets,
        _ice_tcp,
        _timeline,
        _sessions,
        webhooks_context,
        _gc_policy,
    ):
        app.cleanup_ctx.append(context)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics.metrics)
    add_routes(app)
    add_api_routes(app)
    add_ui_routes(app)
    add_webhook_routes(app)
    if config.cluster.enabled:
        from whip.cluster_node import add_cluster_routes

        add_cluster_routes(app)
    return app
