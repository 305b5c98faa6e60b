"""The operator REST API (``/v1``): runs, their events, stop and delete, live sessions.

Routes (answers are JSON; errors are ``{"error": {"code", "message"}}`` from
:mod:`whip.middleware`; the full contract is ``whip/openapi.json``, served at
``GET /v1/openapi.json``):

- ``GET /v1/runs``: newest first (``created_ms``, then id, descending). Filters:
  ``state`` (one of ``starting, live, stopping, ended, interrupted, deleted, expired``;
  ``expired`` is derived at read time, and a run that reads as expired does *not* match
  ``live``/``starting``), ``principal``, ``stream`` (exact; ``stream=`` matches runs
  pushed to bare ``/whip``). Paging: ``limit`` (1..1000, default 100) and ``cursor``, an
  opaque token taken from a previous answer's ``next``. The cursor is a keyset position
  (the last item's sort key), so pages neither repeat nor skip runs when new runs arrive;
  it is only meaningful with the same filters. ``next`` is null on the last page.
- ``GET /v1/runs/{id}``: one run's metadata from the run registry (O(1); nothing of its
  history is read).
- ``GET /v1/runs/{id}/events?after=SEQ&limit=N&wait=S``: events with ``seq > after``,
  oldest first; ``after`` 0..2**63-1 (default 0), ``limit`` 1..1000 (default 100),
  ``wait`` 0..60 seconds (default 0, decimals allowed). With ``wait`` > 0 and nothing
  to answer yet, the request long-polls (:meth:`Timeline.wait_for_events`) and answers
  at the first new event or with an empty list at the deadline (or at once, empty, when
  the server starts shutting down). ``next`` is the last item's seq, or ``after`` when
  there are none: pass it back as ``after``.
- ``POST /v1/runs/{id}/stop``: durable ``stop_requested`` then the live session's close;
  200 ``{"run", "seq", "repeat"}``; the decisions (409 ``not_live``, repeats) are
  :mod:`whip.run_control`'s.
- ``DELETE /v1/runs/{id}``: soft delete, single winner; 200 ``{"event", "repeat"}``. A
  repeat gets the synthesized event (same seq, data ``already_deleted: true``, nothing
  appended); a run id never seen is 404 (:mod:`whip.run_control`).
- ``GET /v1/runs/{id}/recordings``, ``GET /v1/runs/{id}/recordings/{name}`` (Range),
  ``DELETE /v1/runs/{id}/recordings`` (operators): :mod:`whip.routes_recordings`.
- ``GET /v1/sessions``, ``GET /v1/sessions/{id}``: live sessions with their figures
  (:mod:`whip.routes_sessions`, :mod:`whip.live_stats`).

Authentication and isolation (every ``/v1`` route except ``/v1/openapi.json``):

- No token, a malformed one or an unknown one: 401 (``WWW-Authenticate``), before any
  input is looked at. In anonymous mode every caller is an operator.
- Publishers see and control only their own runs and sessions: another principal's run
  or session answers exactly like one that does not exist (404, same code and message),
  never 403, so ids cannot be probed. Publishers may stop and delete their own runs.
- ``principal=`` filter: operators may name anyone. A publisher's own name is implied
  when absent and accepted when given; naming another principal is 403 ``forbidden``
  (an operator-only filter; it says nothing about whether that principal exists).
- Operators see and control everything.

Bad input is 400 (never 500): :mod:`whip.api_params`. Handlers: :mod:`whip.routes_runs`,
:mod:`whip.routes_sessions`; this module registers them and serves the OpenAPI document.

Not done here: CORS (this API is for operators' tools, not browsers; the WHIP routes
carry CORS), ``HEAD`` (GET routes are registered without it).
"""

from __future__ import annotations

import asyncio
import importlib.resources

from aiohttp import web

from whip.appkeys import CLOSING_KEY, OPENAPI_KEY
from whip.routes_recordings import add_recording_routes
from whip.routes_runs import delete_run, get_run, list_runs, run_events, stop_run, thumbnail
from whip.routes_sessions import get_session, list_sessions


def load_openapi() -> bytes:
    """The checked-in OpenAPI 3.1 document (``whip/openapi.json``)."""
    return importlib.resources.files("whip").joinpath("openapi.json").read_bytes()


async def openapi(request: web.Request) -> web.Response:
    """``GET /v1/openapi.json``: the whole HTTP surface (no credentials needed)."""
    return web.Response(body=request.app[OPENAPI_KEY], content_type="application/json")


async def _closing(app: web.Application) -> None:
    app[CLOSING_KEY].set()


def add_api_routes(app: web.Application) -> None:
    """Register the ``/v1`` routes and the OpenAPI document."""
    app[CLOSING_KEY] = asyncio.Event()
    app.on_shutdown.append(_closing)
    app[OPENAPI_KEY] = load_openapi()
    router = app.router
    router.add_get("/v1/openapi.json", openapi, allow_head=False)
    router.add_get("/v1/runs", list_runs, allow_head=False)
    router.add_get("/v1/runs/{run_id}", get_run, allow_head=False)
    router.add_delete("/v1/runs/{run_id}", delete_run)
    router.add_get("/v1/runs/{run_id}/events", run_events, allow_head=False)
    router.add_post("/v1/runs/{run_id}/stop", stop_run)
    router.add_get("/v1/runs/{run_id}/thumbnail.jpg", thumbnail, allow_head=False)
    add_recording_routes(app)
    router.add_get("/v1/sessions", list_sessions, allow_head=False)
    router.add_get("/v1/sessions/{session_id}", get_session, allow_head=False)
