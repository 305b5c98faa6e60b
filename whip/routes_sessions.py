"""``/v1/sessions`` routes: live sessions with their figures (:mod:`whip.live_stats`).

The list is bounded by ``max_sessions``, so it is never paged (``next`` is always null);
filters ``principal`` and ``stream`` as for runs. Another principal's session answers
404 like one that does not exist.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from whip.api_params import caller, principal_filter, session_id_param, stream_filter
from whip.appkeys import SESSIONS_KEY
from whip.errors import NotFoundError
from whip.live_stats import read_figures


async def list_sessions(request: web.Request) -> web.Response:
    """``GET /v1/sessions``: live sessions, oldest first, with their figures."""
    who = await caller(request)
    principal = principal_filter(request, who)
    stream = stream_filter(request)
    sessions = [
        s
        for s in request.app[SESSIONS_KEY].table.live()
        if (principal is None or s.principal == principal)
        and (stream is None or s.stream == stream)
    ]
    sessions.sort(key=lambda s: (s.created_at, s.session_id))
    figures = await asyncio.gather(*(read_figures(s) for s in sessions))
    return web.json_response({"items": [f.to_json() for f in figures], "next": None})


async def get_session(request: web.Request) -> web.Response:
    """``GET /v1/sessions/{id}``: one live session; 404 once it is gone (or not yours)."""
    who = await caller(request)
    session_id = session_id_param(request)
    session = request.app[SESSIONS_KEY].table.get(session_id)
    if session is None or not (who.is_operator or session.principal == who.name):
        raise NotFoundError("session")
    return web.json_response((await read_figures(session)).to_json())
