"""``/v1/runs`` routes: list, one run, its events (long-poll), stop, delete, thumbnail.

Cluster mode: the list pages in the store (:meth:`ClusterTimeline.runs_page`, the same
cursor, filters and order as the embedded registry's in-memory page); a thumbnail of a run
another node owns is carried to that node (:func:`serve_thumbnail`).

The contract of each is in :mod:`whip.routes_api` and ``whip/openapi.json``; stop and
delete decisions are :mod:`whip.run_control`'s. Handlers parse, call and answer; errors
are raised (:mod:`whip.middleware` answers them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from registry.events import Event
from registry.runs import RunView
from registry.timeline import MAX_CURSOR, MAX_READ_LIMIT, MAX_WAIT_S, Timeline
from whip.api_params import (
    DEFAULT_LIMIT,
    InvalidParameterError,
    caller,
    decode_cursor,
    encode_cursor,
    int_param,
    principal_filter,
    query,
    run_id_param,
    seconds_param,
    stream_filter,
)
from whip.appkeys import CLOSING_KEY, CLUSTER_KEY, SESSIONS_KEY
from whip.auth import Principal
from whip.errors import HttpError
from whip.ratelimit import guarded

if TYPE_CHECKING:
    from registry.pg.timeline import ClusterTimeline

logger = logging.getLogger(__name__)


def run_json(request: web.Request, view: RunView) -> dict[str, object]:
    """The run object of ARCHITECTURE.md plus ``recording_bytes`` (its complete
    recording segments on disk, :mod:`whip.recordings`)."""
    body = view.to_json()
    body["recording_bytes"] = request.app[SESSIONS_KEY].recordings.store.run_bytes(view.run_id)
    return body


RUN_STATES = frozenset(
    {"starting", "live", "stopping", "ended", "interrupted", "deleted", "expired"}
)


async def list_runs(request: web.Request) -> web.Response:
    """``GET /v1/runs``: newest first, filtered, keyset-paged."""
    who = await caller(request)
    principal = principal_filter(request, who)
    stream = stream_filter(request)
    state = query(request, "state")
    if state is not None and state not in RUN_STATES:
        raise InvalidParameterError(f"state must be one of {', '.join(sorted(RUN_STATES))}")
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_READ_LIMIT)
    cursor = query(request, "cursor")
    after = decode_cursor(cursor) if cursor is not None else None
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is not None:
        # Cluster mode: paged in the store, same keyset, filters and order.
        found = await cluster.runs_page(
            limit, principal=principal, stream=stream, state=state, before=after
        )
        page = [view for view in found.runs if principal is None or view.principal == principal]
        more = found.more
    else:
        page, more = await _embedded_page(request, principal, stream, state, after, limit)
    return web.json_response(
        {
            "items": [run_json(request, view) for view in page],
            "next": encode_cursor(page[-1]) if more and page else None,
        }
    )


async def _embedded_page(
    request: web.Request,
    principal: str | None,
    stream: str | None,
    state: str | None,
    after: tuple[int, str] | None,
    limit: int,
) -> tuple[list[RunView], bool]:
    """One page of the embedded registry's runs (all in memory: filtered here)."""
    timeline = request.app[SESSIONS_KEY].timeline
    page: list[RunView] = []
    more = False
    for view in await timeline.list_runs(principal):
        if principal is not None and view.principal != principal:
            continue  # never trust an index alone for isolation
        if after is not None and (view.created_ms, view.run_id) >= after:
            continue
        if (state is not None and view.state != state) or (
            stream is not None and view.stream != stream
        ):
            continue
        if len(page) == limit:
            more = True
            break
        page.append(view)
    return page, more


async def get_run(request: web.Request) -> web.Response:
    """``GET /v1/runs/{id}``: the registry's view, O(1)."""
    who = await caller(request)
    run_id = run_id_param(request)
    view = await request.app[SESSIONS_KEY].runs.visible(run_id, who)
    return web.json_response(run_json(request, view))


async def _wait_unless_closing(
    timeline: Timeline | ClusterTimeline,
    run_id: str,
    after: int,
    limit: int,
    wait_s: float,
    closing: asyncio.Event,
) -> list[Event]:
    """:meth:`Timeline.wait_for_events`, cut short (empty answer) when the server begins
    to shut down. Cancellation: the wait is cancelled and its waiter unregistered."""
    if wait_s == 0 or closing.is_set():
        return await timeline.wait_for_events(run_id, after, limit, 0)
    waiter = asyncio.ensure_future(timeline.wait_for_events(run_id, after, limit, wait_s))
    closer = asyncio.ensure_future(closing.wait())
    try:
        await asyncio.wait((waiter, closer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        closer.cancel()
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    return waiter.result() if not waiter.cancelled() else []


async def run_events(request: web.Request) -> web.Response:
    """``GET /v1/runs/{id}/events``: ordered events, long-polling up to ``wait`` s; at
    shutdown a pending long-poll answers at once with what it has (nothing).

    Cancellation: the waiter is unregistered (:meth:`Timeline.wait_for_events`).
    """
    who = await caller(request)
    run_id = run_id_param(request)
    after = int_param(request, "after", 0, 0, MAX_CURSOR)
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_READ_LIMIT)
    wait_s = seconds_param(request, "wait", MAX_WAIT_S)
    manager = request.app[SESSIONS_KEY]
    await manager.runs.visible(run_id, who)
    closing = request.app[CLOSING_KEY]
    events = await _wait_unless_closing(manager.timeline, run_id, after, limit, wait_s, closing)
    return web.json_response(
        {
            "items": [event.to_json() for event in events],
            "next": events[-1].seq if events else after,
        }
    )


@guarded
async def stop_run(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/stop`` (:meth:`whip.run_control.RunControl.stop`).

    Cancellation: the stop transaction runs on (it is detached); only the answer is lost.
    """
    who = await caller(request)
    run_id = run_id_param(request)
    result = await request.app[SESSIONS_KEY].runs.stop(run_id, who)
    return web.json_response(
        {"run": run_json(request, result.run), "seq": result.seq, "repeat": result.repeat}
    )


@guarded
async def delete_run(request: web.Request) -> web.Response:
    """``DELETE /v1/runs/{id}``: single-winner soft delete; repeats are idempotent."""
    who = await caller(request)
    run_id = run_id_param(request)
    result = await request.app[SESSIONS_KEY].runs.delete(run_id, who)
    return web.json_response({"event": result.event.to_json(), "repeat": result.synthesized})


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


async def thumbnail(request: web.Request) -> web.StreamResponse:
    """``GET /v1/runs/{id}/thumbnail.jpg`` (:func:`serve_thumbnail`)."""
    who = await caller(request)
    return await serve_thumbnail(request, who, run_id_param(request), carry=True)


async def serve_thumbnail(
    request: web.Request, who: Principal, run_id: str, *, carry: bool
) -> web.StreamResponse:
    """The run's newest JPEG: a live session's from memory, else the file the thumbnailer
    left under ``<data_dir>/thumbnails/`` (read off the loop); 404 ``no_thumbnail`` when
    there is none yet. The id is validated first, so no path can reach the filesystem.

    Cluster mode: the session and the file are on the run's owner node. With ``carry``
    (the public route), a run another node owns is asked of that node
    (:func:`whip.cluster_node.carry_run_request`), after the isolation check here."""
    manager = request.app[SESSIONS_KEY]
    view = await manager.runs.visible(run_id, who)
    session = manager.find_by_run(run_id)
    cluster = request.app.get(CLUSTER_KEY)
    if carry and session is None and cluster is not None:
        from whip.cluster_node import carry_run_request

        secret = manager.config.cluster.secret
        carried = await carry_run_request(request, cluster, secret, who, view)
        if carried is not None:
            return carried
    jpeg = session.analysis.latest_thumbnail() if session and session.analysis else None
    if jpeg is None:
        path = manager.config.server.data_dir / "thumbnails" / f"{run_id}.jpg"
        jpeg = await asyncio.to_thread(_read_file, path)
    if not jpeg:
        raise HttpError("no thumbnail yet", http_status=404, code="no_thumbnail")
    return web.Response(body=jpeg, content_type="image/jpeg", headers={"Cache-Control": "no-store"})
