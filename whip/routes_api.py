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
- ``POST /v1/runs/{id}/stop``: durable ``stop_requested`` then the live session's close
  (:meth:`SessionManager.stop_run`); 200 ``{"run", "seq", "repeat"}``.
  Decisions: a run already ``ended``, ``interrupted`` or ``deleted`` is 409
  ``not_live``. A run already stopping (a stop in flight in this process, or the state
  ``stopping``) is 200 with ``repeat: true`` and the seq of the first ``stop_requested``:
  nothing is appended again. Concurrent stops of one run share one transaction.
  ``starting``, ``live`` and ``expired`` runs can be stopped.
- ``DELETE /v1/runs/{id}``: soft delete, single winner (:meth:`SessionManager.delete_run`);
  200 ``{"event", "repeat"}``. A repeat gets the synthesized event (same seq, data
  ``already_deleted: true``, nothing appended). A run id never seen (or no longer
  retained) is 404 and nothing is appended: existence is checked first, because the
  registry's delete appends ``run_deleted`` for unknown ids.
- ``GET /v1/sessions``, ``GET /v1/sessions/{id}``: live sessions with their statistics
  (:func:`session_json`); filters ``principal`` and ``stream`` as for runs. The list is
  bounded by ``max_sessions``, so it is never paged (``next`` is always null).

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

Bad input is 400 (never 500): path ids that are not ids (the registry's run-id syntax,
the session-id syntax; ``..``, encoded slashes, NULs, ...), non-integer or out-of-range
``limit``/``after``/``wait``, a malformed cursor, an unknown ``state``, a parameter
given twice. Codes: ``bad_id``, ``invalid_parameter``, ``invalid_cursor``.

Not done here: CORS (this API is for operators' tools, not browsers; the WHIP routes
carry CORS), ``HEAD`` (GET routes are registered without it).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import importlib.resources
import logging
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from pipeline.decoder import DecodeStats
from pipeline.intake import FrameIntake, IntakeStats
from registry.events import Event, EventType, is_valid_run_id
from registry.runs import RunView
from registry.timeline import MAX_CURSOR, MAX_READ_LIMIT, MAX_WAIT_S, Timeline
from whip.auth import ForbiddenError, Principal, Role
from whip.errors import HttpError, NotFoundError
from whip.ratelimit import guarded
from whip.routes_whip import AUTH_KEY, SESSIONS_KEY
from whip.session import WhipSession
from whip.session_stats import rtp_discarded

logger = logging.getLogger(__name__)

STOPS_KEY = web.AppKey("api_stops", dict[str, asyncio.Task[int]])
CLOSING_KEY = web.AppKey("api_closing", asyncio.Event)
"""Set at shutdown: long-polls answer at once instead of holding shutdown up to 60 s."""
OPENAPI_KEY = web.AppKey("openapi", bytes)

DEFAULT_LIMIT = 100
RUN_STATES = frozenset(
    {"starting", "live", "stopping", "ended", "interrupted", "deleted", "expired"}
)
NOT_LIVE = frozenset({"ended", "interrupted", "deleted"})
VIDEO_CLOCK_HZ = 90_000
AUDIO_CLOCK_HZ = 48_000
"""RTP clocks of what the offer policy accepts (H.264/VP8 at 90 kHz, Opus at 48 kHz);
aiortc reports jitter in these units."""
MIN_RATE_SPAN_S = 1.0
"""Averages (fps, bitrate) are null until a track has decoded for this long."""

_SESSION_ID = re.compile(r"s_[A-Za-z0-9_-]{22}")
_PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_STREAM = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,63})?")
_UINT = re.compile(r"[0-9]{1,25}")
_NUMBER = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,3})?")
_CURSOR = re.compile(r"[A-Za-z0-9_-]{4,400}")


class BadIdError(HttpError):
    """A path id that cannot be an id at all."""

    code = "bad_id"


class InvalidParameterError(HttpError):
    """A query parameter that is not what the API takes."""

    code = "invalid_parameter"


class InvalidListCursorError(HttpError):
    """A ``cursor`` that no answer of ours produced."""

    code = "invalid_cursor"


class NotLiveError(HttpError):
    """Stop of a run that is over."""

    http_status = 409
    code = "not_live"


# ---------------------------------------------------------------- request parsing


def _caller(request: web.Request) -> Principal:
    """The authenticated principal (401 first, whatever else is wrong)."""
    return request.app[AUTH_KEY].require(request.headers.get("Authorization"), Role.PUBLISHER)


def _query(request: web.Request, name: str) -> str | None:
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise InvalidParameterError(f"{name} given more than once")
    return values[0] if values else None


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = _query(request, name)
    if raw is None:
        return default
    if not _UINT.fullmatch(raw) or not low <= int(raw) <= high:
        raise InvalidParameterError(f"{name} must be an integer from {low} to {high}")
    return int(raw)


def _seconds_param(request: web.Request, name: str, high: float) -> float:
    raw = _query(request, name)
    if raw is None:
        return 0.0
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not 0.0 <= value <= high:  # also false for nan and inf
        raise InvalidParameterError(f"{name} must be a number of seconds from 0 to {high:g}")
    return value


def _principal_filter(request: web.Request, caller: Principal) -> str | None:
    """The principal the caller may look at (module doc): None means everyone."""
    named = _query(request, "principal")
    if named is not None and not _PRINCIPAL.fullmatch(named):
        raise InvalidParameterError("principal must be a principal name")
    if caller.is_operator:
        return named
    if named is not None and named != caller.name:
        raise ForbiddenError("the principal filter naming others is for operators")
    return caller.name


def _stream_filter(request: web.Request) -> str | None:
    stream = _query(request, "stream")
    if stream is not None and not _STREAM.fullmatch(stream):
        raise InvalidParameterError("stream must be empty or 1-64 chars of [A-Za-z0-9_.-]")
    return stream


def _run_id(request: web.Request) -> str:
    run_id = request.match_info["run_id"]
    if not is_valid_run_id(run_id):
        raise BadIdError("run ids are 1-128 chars of [A-Za-z0-9_.:-], starting alphanumeric")
    return run_id


def _visible_run(timeline: Timeline, run_id: str, caller: Principal) -> RunView:
    """The run, if it exists and ``caller`` may see it; else 404 (isolation: others'
    runs look exactly like missing ones)."""
    view = timeline.runs.get(run_id)
    if view is None or not (caller.is_operator or view.principal == caller.name):
        raise NotFoundError("run")
    return view


def encode_cursor(view: RunView) -> str:
    """The opaque ``next`` of a runs page ending at ``view``."""
    raw = f"{view.created_ms}.{view.run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The sort key in ``cursor``; 400 for anything :func:`encode_cursor` cannot make."""
    bad = InvalidListCursorError("cursor is not one this server gave out")
    if not _CURSOR.fullmatch(cursor):
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError) as exc:
        raise bad from exc
    created, _, run_id = raw.partition(".")
    if not _UINT.fullmatch(created) or int(created) > MAX_CURSOR or not is_valid_run_id(run_id):
        raise bad
    return int(created), run_id


# ---------------------------------------------------------------- runs


async def list_runs(request: web.Request) -> web.Response:
    """``GET /v1/runs`` (module doc)."""
    caller = _caller(request)
    principal = _principal_filter(request, caller)
    stream = _stream_filter(request)
    state = _query(request, "state")
    if state is not None and state not in RUN_STATES:
        raise InvalidParameterError(f"state must be one of {', '.join(sorted(RUN_STATES))}")
    limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_READ_LIMIT)
    cursor = _query(request, "cursor")
    after = decode_cursor(cursor) if cursor is not None else None
    timeline = request.app[SESSIONS_KEY].timeline
    page: list[RunView] = []
    more = False
    for view in timeline.runs.list_runs(principal):
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
    return web.json_response(
        {
            "items": [view.to_json() for view in page],
            "next": encode_cursor(page[-1]) if more else None,
        }
    )


async def get_run(request: web.Request) -> web.Response:
    """``GET /v1/runs/{id}``: the registry's view, O(1)."""
    caller = _caller(request)
    run_id = _run_id(request)
    view = _visible_run(request.app[SESSIONS_KEY].timeline, run_id, caller)
    return web.json_response(view.to_json())


async def _wait_unless_closing(
    timeline: Timeline, run_id: str, after: int, limit: int, wait_s: float, closing: asyncio.Event
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
    caller = _caller(request)
    run_id = _run_id(request)
    after = _int_param(request, "after", 0, 0, MAX_CURSOR)
    limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_READ_LIMIT)
    wait_s = _seconds_param(request, "wait", MAX_WAIT_S)
    timeline = request.app[SESSIONS_KEY].timeline
    _visible_run(timeline, run_id, caller)
    closing = request.app[CLOSING_KEY]
    events = await _wait_unless_closing(timeline, run_id, after, limit, wait_s, closing)
    return web.json_response(
        {
            "items": [event.to_json() for event in events],
            "next": events[-1].seq if events else after,
        }
    )


async def _first_stop_seq(timeline: Timeline, run_id: str) -> int | None:
    """The seq of the run's first ``stop_requested`` (a repeat's answer). Reads the
    run's history: only for the rare repeat that no in-flight stop can answer."""
    after = 0
    while True:
        batch = await timeline.read_events(run_id, after, MAX_READ_LIMIT)
        for event in batch:
            if event.type == EventType.STOP_REQUESTED:
                return event.seq
        if len(batch) < MAX_READ_LIMIT:
            return None
        after = batch[-1].seq


def _forget_stop(stops: dict[str, asyncio.Task[int]], run_id: str) -> Callable[..., None]:
    def done(task: asyncio.Task[int]) -> None:
        if stops.get(run_id) is task:
            del stops[run_id]
        if not task.cancelled() and task.exception() is not None:
            logger.warning("run %s: stop failed: %r", run_id, task.exception())

    return done


@guarded
async def stop_run(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/stop`` (module doc for the decisions).

    Cancellation: the stop transaction runs on (it is detached); only the answer is lost.
    """
    caller = _caller(request)
    run_id = _run_id(request)
    manager = request.app[SESSIONS_KEY]
    timeline = manager.timeline
    view = _visible_run(timeline, run_id, caller)
    stops = request.app[STOPS_KEY]
    task = stops.get(run_id)
    repeat = task is not None
    seq: int | None
    if task is None and view.state == "stopping":
        seq = await _first_stop_seq(timeline, run_id)
        repeat = True
    elif task is None:
        if view.state in NOT_LIVE:
            raise NotLiveError(f"run is {view.state}; only a live run can be stopped")
        task = asyncio.ensure_future(manager.stop_run(run_id, caller.name))
        task.set_name(f"api-stop-{run_id}")
        stops[run_id] = task
        task.add_done_callback(_forget_stop(stops, run_id))
    if task is not None:
        seq = await asyncio.shield(task)
    after = timeline.runs.get(run_id) or view
    logger.info("run %s: stop by %s (repeat %s) -> %s", run_id, caller.name, repeat, after.state)
    return web.json_response({"run": after.to_json(), "seq": seq, "repeat": repeat})


@guarded
async def delete_run(request: web.Request) -> web.Response:
    """``DELETE /v1/runs/{id}``: single-winner soft delete; repeats are idempotent."""
    caller = _caller(request)
    run_id = _run_id(request)
    manager = request.app[SESSIONS_KEY]
    _visible_run(manager.timeline, run_id, caller)
    result = await manager.delete_run(run_id, caller.name)
    return web.json_response({"event": result.event.to_json(), "repeat": result.synthesized})


# ---------------------------------------------------------------- sessions


def _rate(count: int, stats: DecodeStats | None, now: float) -> float | None:
    first = stats.first_decoded_at if stats is not None else None
    if first is None or now - first < MIN_RATE_SPAN_S:
        return None
    return round(count / (now - first), 2)


def _track_json(
    kind: str, intake: FrameIntake | None, stats: DecodeStats | None, alive: bool, now: float
) -> dict[str, Any]:
    queue: IntakeStats | None = intake.stats() if intake is not None else None
    bytes_in = queue.bytes_in if queue is not None else 0
    bitrate = _rate(bytes_in * 8, stats, now)
    return {
        "kind": kind,
        "codec": stats.codec if stats is not None else None,
        "width": stats.width if stats is not None else None,
        "height": stats.height if stats is not None else None,
        "fps": _rate(stats.frames_decoded, stats, now) if stats is not None else None,
        "bitrate_bps": round(bitrate) if bitrate is not None else None,
        "frames_in": queue.frames_in if queue is not None else 0,
        "frames_decoded": stats.frames_decoded if stats is not None else 0,
        "frames_dropped": queue.dropped_frames if queue is not None else 0,
        "frames_oversized": queue.oversized_frames if queue is not None else 0,
        "decode_errors": stats.decode_errors if stats is not None else 0,
        "queue_depth": queue.depth if queue is not None else 0,
        "queue_max_depth": queue.max_depth if queue is not None else 0,
        "queue_limit": intake.depth_limit if intake is not None else 0,
        "keyframe_requests": queue.keyframe_requests if queue is not None else 0,
        "worker_alive": alive,
        "packets_received": None,
        "packets_lost": None,
        "jitter_ms": None,
    }


async def _rtp_stats(session: WhipSession) -> list[tuple[str, int, int, float]]:
    """``(kind, packets_received, packets_lost, jitter_ms)`` per inbound RTP stream, in
    transceiver order, from aiortc's ``RTCInboundRtpStreamStats``. Empty when the peer
    is gone or closing (statistics are best effort)."""
    found: list[tuple[str, int, int, float]] = []
    try:
        transceivers = list(session.pc.getTransceivers())
        for transceiver in transceivers:
            report = await transceiver.receiver.getStats()
            for stats in report.values():
                if getattr(stats, "type", None) != "inbound-rtp":
                    continue
                kind = str(stats.kind)
                clock = VIDEO_CLOCK_HZ if kind == "video" else AUDIO_CLOCK_HZ
                jitter_ms = round(float(stats.jitter) * 1000 / clock, 3)
                found.append((kind, int(stats.packetsReceived), int(stats.packetsLost), jitter_ms))
    except Exception as exc:  # a peer closing under us: no RTP figures this time
        logger.debug("session %s: no RTP stats: %r", session.session_id, exc)
        return []
    return found


def session_json(
    session: WhipSession, rtp: list[tuple[str, int, int, float]], now: float | None = None
) -> dict[str, Any]:
    """The wire shape of one live session: identity, peer state, per-track statistics
    and a summary (the first video track's codec/size/fps; totals of bitrate, loss,
    queue depth and drops; the worst jitter).

    ``fps`` and ``bitrate_bps`` are averages since the track's first decoded frame, to
    now (a stalled stream's figures fall), null for its first second.
    """
    now = time.monotonic() if now is None else now
    tracks: list[dict[str, Any]] = []
    runtime = session.runtime
    workers = runtime.workers if runtime is not None else ()
    if workers:
        for worker in workers:
            alive = worker.thread is not None and worker.thread.is_alive()
            tracks.append(_track_json(worker.intake.kind, worker.intake, worker.stats, alive, now))
    else:
        for intake in session.intakes:
            tracks.append(_track_json(intake.kind, intake, None, False, now))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for track in tracks:
        by_kind.setdefault(track["kind"], []).append(track)
    for kind, received, lost, jitter_ms in rtp:
        pending = [t for t in by_kind.get(kind, []) if t["packets_received"] is None]
        if not pending:
            track = _track_json(kind, None, None, False, now)
            tracks.append(track)
            by_kind.setdefault(kind, []).append(track)
            pending = [track]
        pending[0].update(packets_received=received, packets_lost=lost, jitter_ms=jitter_ms)
    video = next((t for t in tracks if t["kind"] == "video"), tracks[0] if tracks else None)
    bitrates = [t["bitrate_bps"] for t in tracks if t["bitrate_bps"] is not None]
    jitters = [t["jitter_ms"] for t in tracks if t["jitter_ms"] is not None]
    return {
        "id": session.session_id,
        "run_id": session.run_id,
        "principal": session.principal,
        "stream": session.stream,
        "state": str(session.pc.connectionState),
        "connected": session.connected,
        "age_s": round(now - session.created_at, 3),
        "codec": video["codec"] if video is not None else None,
        "width": video["width"] if video is not None else None,
        "height": video["height"] if video is not None else None,
        "fps": video["fps"] if video is not None else None,
        "bitrate_bps": sum(bitrates) if bitrates else None,
        "packets_received": sum(t["packets_received"] or 0 for t in tracks) if rtp else None,
        "packets_lost": sum(t["packets_lost"] or 0 for t in tracks) if rtp else None,
        "jitter_ms": max(jitters) if jitters else None,
        "queue_depth": sum(t["queue_depth"] for t in tracks),
        "drops": sum(t["frames_dropped"] for t in tracks),
        "workers": sum(1 for t in tracks if t["worker_alive"]),
        "workers_detached": len(runtime.detached) if runtime is not None else 0,
        "rtp_discarded": rtp_discarded(session),
        "tracks": tracks,
    }


def _session_id(request: web.Request) -> str:
    session_id = request.match_info["session_id"]
    if not _SESSION_ID.fullmatch(session_id):
        raise BadIdError("session ids are s_ and 22 chars of [A-Za-z0-9_-]")
    return session_id


async def list_sessions(request: web.Request) -> web.Response:
    """``GET /v1/sessions``: live sessions, oldest first, with statistics."""
    caller = _caller(request)
    principal = _principal_filter(request, caller)
    stream = _stream_filter(request)
    sessions = [
        s
        for s in request.app[SESSIONS_KEY].table.live()
        if (principal is None or s.principal == principal)
        and (stream is None or s.stream == stream)
    ]
    sessions.sort(key=lambda s: (s.created_at, s.session_id))
    rtp = await asyncio.gather(*(_rtp_stats(s) for s in sessions))
    items = [session_json(s, r) for s, r in zip(sessions, rtp, strict=True)]
    return web.json_response({"items": items, "next": None})


async def get_session(request: web.Request) -> web.Response:
    """``GET /v1/sessions/{id}``: one live session; 404 once it is gone (or not yours)."""
    caller = _caller(request)
    session_id = _session_id(request)
    session = request.app[SESSIONS_KEY].table.get(session_id)
    if session is None or not (caller.is_operator or session.principal == caller.name):
        raise NotFoundError("session")
    return web.json_response(session_json(session, await _rtp_stats(session)))


# ---------------------------------------------------------------- the document


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


async def thumbnail(request: web.Request) -> web.StreamResponse:
    """The run's newest JPEG: a live session's from memory, else the file the thumbnailer
    left under ``<data_dir>/thumbnails/`` (read off the loop); 404 ``no_thumbnail`` when
    there is none yet. The id is validated first, so no path can reach the filesystem."""
    caller = _caller(request)
    run_id = _run_id(request)
    manager = request.app[SESSIONS_KEY]
    _visible_run(manager.timeline, run_id, caller)
    session = manager.find_by_run(run_id)
    jpeg = session.analysis.latest_thumbnail() if session and session.analysis else None
    if jpeg is None:
        path = manager.config.server.data_dir / "thumbnails" / f"{run_id}.jpg"
        jpeg = await asyncio.to_thread(_read_file, path)
    if not jpeg:
        raise HttpError("no thumbnail yet", http_status=404, code="no_thumbnail")
    return web.Response(body=jpeg, content_type="image/jpeg", headers={"Cache-Control": "no-store"})


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
    app[STOPS_KEY] = {}
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
    router.add_get("/v1/sessions", list_sessions, allow_head=False)
    router.add_get("/v1/sessions/{session_id}", get_session, allow_head=False)
