"""Every typed ``web.AppKey`` of the application, in one place.

Types are named for the type checker only (imported under ``TYPE_CHECKING``), so this
module imports none of the modules whose objects it keys and any module may import it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from registry.pg.timeline import ClusterTimeline
    from registry.timeline import Timeline
    from whip.auth import Authenticator
    from whip.config import Config
    from whip.metrics import ServerCollector
    from whip.ratelimit import RequestLimiter
    from whip.routes_ui import UiFile
    from whip.rtc.ice_tcp import IceTcpListener
    from whip.rtc.session_sockets import SessionSockets
    from whip.rtc.udp_mux import UdpMux
    from whip.session_manager import SessionManager, SessionSeams
    from whip.webhooks.status import WebhookStatus

CONFIG_KEY: web.AppKey[Config] = web.AppKey("config")
SEAMS_KEY: web.AppKey[SessionSeams] = web.AppKey("session_seams")
AUTH_KEY: web.AppKey[Authenticator] = web.AppKey("auth")
LIMITER_KEY: web.AppKey[RequestLimiter] = web.AppKey("request_limiter")
TIMELINE_KEY: web.AppKey[Timeline] = web.AppKey("timeline")
SESSIONS_KEY: web.AppKey[SessionManager] = web.AppKey("sessions")
METRICS_KEY: web.AppKey[ServerCollector] = web.AppKey("metrics")
REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("metrics_registry")
ICE_TCP_KEY: web.AppKey[IceTcpListener] = web.AppKey("ice_tcp")
"""The ICE-TCP listener; absent when ``ice.tcp_port`` is -1."""
OPENAPI_KEY: web.AppKey[bytes] = web.AppKey("openapi")
ICE_SOCKETS_KEY: web.AppKey[UdpMux | SessionSockets] = web.AppKey("ice_sockets")
"""The sockets of the server's ICE: the shared port (``ice.udp_mux``) or per-session ones."""
CLUSTER_KEY: web.AppKey[ClusterTimeline] = web.AppKey("cluster")
"""Cluster mode's timeline (absent on the embedded WAL, where ``TIMELINE_KEY`` is set)."""
CLOSING_KEY: web.AppKey[asyncio.Event] = web.AppKey("api_closing")
"""Set at shutdown: long-polls answer at once instead of holding shutdown up to 60 s."""
WEBHOOKS_KEY: web.AppKey[list[WebhookStatus]] = web.AppKey("webhooks")
"""One deliverer per ``[[webhooks]]`` entry, in config order (:mod:`whip.webhooks`)."""
UI_FILES_KEY: web.AppKey[dict[str, UiFile]] = web.AppKey("ui_files")
"""The operator dashboard's files, loaded at app creation (:mod:`whip.routes_ui`)."""
