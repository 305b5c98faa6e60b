"""WHIP (RFC 9725) routes: the endpoint, the session URL, OPTIONS and the 405s.

- ``POST /whip`` and ``POST /whip/{stream}``: checks before any resource is taken
  (auth, Content-Type, size, SDP syntax, something receivable), then the detached
  session transaction; 201 with the answer, ``Location``, ``ETag``, ``X-Run-Id`` and
  ``Link`` headers. An offer aiortc refuses (its parser, first, then its checks in the
  transaction: it is stricter than :func:`whip.sdp.check_offer`, e.g. on ``a=rtcp-mux``
  or on sections the plan rejects) is 422 ``unprocessable_offer``, not a 500.
- ``DELETE /whip/sessions/{id}``: closes the session (reason ``deleted``); a repeat is
  200 from the reclaimed-session tombstone; an id never seen is 404.
- ``PATCH /whip/sessions/{id}``: trickle ICE (204); an ICE restart gets 422.
- ``GET``/``HEAD``/``PUT`` on the endpoint, and ``GET``/``HEAD``/``POST``/``PUT`` on the
  session URL, are 405: RFC 9725 reserves them.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiortc import sdp as aiortc_sdp

from registry.errors import RegistryError
from whip.admission import admission_outcome
from whip.appkeys import AUTH_KEY, SESSIONS_KEY
from whip.auth import Principal, Role
from whip.cors import add_cors
from whip.errors import HttpError, NotFoundError
from whip.live_session import CloseReason
from whip.middleware import json_error_prepare
from whip.names import STREAM_RULE, is_session_id, is_stream_name
from whip.ratelimit import guarded
from whip.sdp import (
    SdpTooLargeError,
    UnprocessableOfferError,
    check_content_type,
    check_offer,
)
from whip.trickle import CONTENT_TYPE as TRICKLE_CONTENT_TYPE
from whip.trickle import MAX_FRAGMENT_BYTES, FragmentTooLargeError, parse_fragment

logger = logging.getLogger(__name__)


_cors = add_cors


def _principal(request: web.Request) -> Principal:
    return request.app[AUTH_KEY].require(request.headers.get("Authorization"), Role.PUBLISHER)


async def _read_body(request: web.Request, limit: int, too_large: HttpError) -> bytes:
    """The body, read to its end but never past ``limit + 1`` bytes (the checks then see
    it is too large). A declared ``Content-Length`` above ``limit`` raises ``too_large``
    without reading: ``content.read(n)`` answers with what has arrived so far, so one
    read of a large body still on its way would be judged by its first packet.

    Cancellation: what was read is dropped.
    """
    length = request.content_length
    if length is not None and length > limit:
        raise too_large
    body = b""
    while len(body) <= limit:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            break
        body += chunk
    return body


def _check_aiortc_parses(offer: str) -> None:
    """422 unless aiortc's own SDP parser takes ``offer`` (it is pure: nothing is taken).

    The parser raises on offers :func:`whip.sdp.check_offer` accepts (an ``a=fmtp`` for
    a payload type with no ``a=rtpmap`` ends in ``StopIteration``, ...), and would do so
    inside the session transaction, after resources were taken. The offer is parsed
    again by ``setRemoteDescription`` (aiortc takes no parsed form); the cost of parsing
    twice is small (``docs/PERFORMANCE.md``, "SDP").
    """
    try:
        aiortc_sdp.SessionDescription.parse(offer)
    except Exception as exc:
        logger.info("offer refused by aiortc's SDP parser: %r", exc)
        raise UnprocessableOfferError(f"offer refused by the WebRTC stack: {exc!r}") from exc


@guarded
async def post_whip(request: web.Request) -> web.StreamResponse:
    """Accept a push; every answer is counted by outcome (``whip_admissions_total``)."""
    manager = request.app[SESSIONS_KEY]
    try:
        response = await _post_whip(request)
    except HttpError as exc:
        manager.admissions[admission_outcome(exc.http_status, exc.code)] += 1
        raise
    except RegistryError as exc:
        manager.admissions[admission_outcome(exc.http_status, exc.code)] += 1
        raise
    manager.admissions["accepted"] += 1
    return response


async def _post_whip(request: web.Request) -> web.StreamResponse:
    """Checks first (no resource taken), then the session transaction."""
    posted_at = time.monotonic()
    principal = _principal(request)
    stream = request.match_info.get("stream", "")
    if stream and (not is_stream_name(stream) or stream == "sessions"):
        raise HttpError(f"stream names are {STREAM_RULE}", code="bad_stream")
    check_content_type(request.headers.get("Content-Type"))
    manager = request.app[SESSIONS_KEY]
    limit = manager.config.limits.sdp_max_bytes
    too_large = SdpTooLargeError(f"SDP is {request.content_length} bytes, the limit is {limit}")
    body = await _read_body(request, limit, too_large)
    await manager.check_turns.turn()  # no await between the turn and the check
    summary = check_offer(body, max_bytes=limit)
    offer = body.decode("utf-8")
    _check_aiortc_parses(offer)
    admitted = await manager.admit(principal.name, stream, offer, summary, posted_at)
    session = admitted.session
    manager.post_latency.observe(time.monotonic() - posted_at)
    logger.info(
        "session %s run %s: 201 in %.1f ms",
        session.session_id,
        session.run_id,
        (time.monotonic() - posted_at) * 1000,
    )
    location = f"/whip/sessions/{session.session_id}"
    response = web.Response(
        status=201,
        body=admitted.answer_sdp.encode(),
        content_type="application/sdp",
        headers={
            "Location": location,
            "ETag": session.etag,
            "X-Run-Id": session.run_id,
            "Link": f'</v1/runs/{session.run_id}>; rel="related"',
        },
    )
    for server in manager.config.server.ice_servers:
        response.headers.add("Link", f'<{server.url}>; rel="ice-server"')
    return _cors(request, response)


@guarded
async def delete_session(request: web.Request) -> web.StreamResponse:
    """Close a session; idempotent through the tombstone."""
    principal = _principal(request)
    session_id = request.match_info["session_id"]
    manager = request.app[SESSIONS_KEY]
    session = manager.table.get(session_id) if is_session_id(session_id) else None
    if session is not None and (principal.is_operator or session.principal == principal.name):
        await manager.close(session, CloseReason.DELETED)
        return _cors(request, web.Response(status=200))
    stone = manager.table.tombstone(session_id)
    if stone is not None:
        return _cors(request, web.Response(status=200))
    raise NotFoundError("session")


@guarded
async def patch_session(request: web.Request) -> web.StreamResponse:
    """Trickle ICE (204); an ICE restart is refused (422).

    ``If-Match`` is checked when present (412 on a stale entity tag, ``*`` matches);
    clients that omit it are served, since several encoders do not send it.
    """
    principal = _principal(request)
    session_id = request.match_info["session_id"]
    manager = request.app[SESSIONS_KEY]
    session = manager.table.get(session_id) if is_session_id(session_id) else None
    if session is None or not (principal.is_operator or session.principal == principal.name):
        raise NotFoundError("session")
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type != TRICKLE_CONTENT_TYPE:
        raise HttpError(
            f"PATCH takes {TRICKLE_CONTENT_TYPE}", http_status=415, code="unsupported_media_type"
        )
    if_match = request.headers.get("If-Match")
    if if_match is not None and if_match.strip() not in ("*", session.etag):
        raise HttpError("stale entity tag", http_status=412, code="precondition_failed")
    body = await _read_body(request, MAX_FRAGMENT_BYTES, FragmentTooLargeError())
    fragment = parse_fragment(body)
    await manager.trickle(session, fragment)
    return _cors(request, web.Response(status=204, headers={"ETag": session.etag}))


async def options_whip(request: web.Request) -> web.StreamResponse:
    """CORS preflight and ``Accept-Post``."""
    response = web.Response(status=204)
    response.headers["Accept-Post"] = "application/sdp"
    response.headers["Access-Control-Allow-Methods"] = "OPTIONS, POST, DELETE, PATCH"
    response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, If-Match"
    response.headers["Access-Control-Max-Age"] = "600"
    return _cors(request, response)


def _reserved(allow: str) -> web.Response:
    raise web.HTTPMethodNotAllowed(
        "reserved by RFC 9725", allow.split(", "), headers={"Allow": allow}
    )


async def endpoint_reserved(request: web.Request) -> web.StreamResponse:
    """GET/HEAD/PUT on the WHIP endpoint: 405."""
    return _reserved("OPTIONS, POST")


async def session_reserved(request: web.Request) -> web.StreamResponse:
    """GET/HEAD/POST/PUT on the session URL: 405."""
    return _reserved("OPTIONS, DELETE, PATCH")


def add_routes(app: web.Application) -> None:
    """Register the WHIP routes (and the error-shape hook of :mod:`whip.middleware`, for
    answers aiohttp makes outside the middleware chain)."""
    app.on_response_prepare.append(json_error_prepare)
    for path in ("/whip", "/whip/{stream}"):
        app.router.add_post(path, post_whip)
        app.router.add_route("OPTIONS", path, options_whip)
        app.router.add_get(path, endpoint_reserved, allow_head=True)
        app.router.add_put(path, endpoint_reserved)
    session = "/whip/sessions/{session_id}"
    app.router.add_delete(session, delete_session)
    app.router.add_patch(session, patch_session)
    app.router.add_route("OPTIONS", session, options_whip)
    app.router.add_get(session, session_reserved, allow_head=True)
    app.router.add_post(session, session_reserved)
    app.router.add_put(session, session_reserved)
