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

    from registry.timeline import Timeline
    from whip.auth import Authenticator
    from whip.config import Config
    from whip.metrics import ServerCollector
    from whip.ratelimit import RequestLimiter
    from whip.session_manager import SessionManager, SessionSeams

CONFIG_KEY: web.AppKey[Config] = web.AppKey("config")
SEAMS_KEY: web.AppKey[SessionSeams] = web.AppKey("session_seams")
AUTH_KEY: web.AppKey[Authenticator] = web.AppKey("auth")
LIMITER_KEY: web.AppKey[RequestLimiter] = web.AppKey("request_limiter")
TIMELINE_KEY: web.AppKey[Timeline] = web.AppKey("timeline")
SESSIONS_KEY: web.AppKey[SessionManager] = web.AppKey("sessions")
METRICS_KEY: web.AppKey[ServerCollector] = web.AppKey("metrics")
REGISTRY_KEY: web.AppKey[CollectorRegistry] = web.AppKey("metrics_registry")
OPENAPI_KEY: web.AppKey[bytes] = web.AppKey("openapi")
CLOSING_KEY: web.AppKey[asyncio.Event] = web.AppKey("api_closing")
"""Set at shutdown: long-polls answer at once instead of holding shutdown up to 60 s."""
