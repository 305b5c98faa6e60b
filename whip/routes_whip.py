"""WHIP (RFC 9725) routes: the endpoint, the session URL, OPTIONS and the 405s.

- ``POST /whip`` and ``POST /whip/{stream}``: checks before any resource is taken
  (auth, Content-Type, size, SDP syntax, something receivable), then the detached
  session transaction; 201 with the answer, ``Location``, ``ETag``, ``X-Run-Id`` and
  ``Link`` headers. An offer aiortc refuses (its parser, first, then its checks in the
  transaction: it is stricter than :func:`whip.sdp.check_offer`, e.g. on ``a=rtcp-mux``
  or on sections the plan rejects) is 422 ``unprocessable_offer``, not a 500.
- ``DELETE /whip/sessions/{id}``: closes the session (reason ``deleted``); a repeat is
  200 from the reclaimed-session tombstone; an id never seen is 404.
- ``PATCH /whip/sessions/{id}``: trickle ICE (204, no ETag) or, with ``If-Match: "*"``,
  an ICE restart (200, the server's new credentials and candidates, a new ``ETag``);
  the rules (428 without a precondition, 412 on a stale tag, serialized per session) are
  :mod:`whip.trickle`'s and :mod:`whip.session_patch`'s.
- Cluster mode: ``Location`` and the run ``Link`` name this node's ``advertise_url``; a
  session DELETE or PATCH for a session another node holds is carried to it and answered
  as it answers (:mod:`whip.cluster_node`); the owner serves it on
  ``/internal/v1/sessions/{id}``, only for a request signed with ``cluster.secret``.
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
from whip.appkeys import CLUSTER_KEY, SESSIONS_KEY
from whip.auth import Principal, require_caller
from whip.cors import ALLOW_HEADERS, add_cors
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
    principal = await require_caller(request)
    stream = request.match_info.get("stream", "")
    if stream and (not is_stream_name(stream) or stream == "sessions"):
        raise HttpError(f"stream names are {STREAM_RULE}", code="bad_stream")
    check_content_type(request.headers.get("Content-Type"))
    manager = request.app[SESSIONS_KEY]
    limit = manager.config.limits.sdp_max_bytes
    too_large = SdpTooLargeError(f"SDP is {request.content_length} bytes, the limit is {limit}")
    body = await _read_body(request, limit, too_large)
    await manager.check_turns.turn()  # no await between the turn and the check
    summary = check_offer(body, max_bytes=limit, video_codecs=manager.config.pipeline.video_codecs)
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
    cluster = request.app.get(CLUSTER_KEY)
    base = cluster.config.advertise_url if cluster is not None else ""
    location = f"{base}/whip/sessions/{session.session_id}"
    response = web.Response(
        status=201,
        body=admitted.answer_sdp.encode(),
        content_type="application/sdp",
        headers={
            "Location": location,
            "ETag": session.etag,
            "X-Run-Id": session.run_id,
            "Link": f'<{base}/v1/runs/{session.run_id}>; rel="related"',
            "Accept-Patch": TRICKLE_CONTENT_TYPE,
        },
    )
    for server in manager.config.server.ice_servers:
        response.headers.add("Link", f'<{server.url}>; rel="ice-server"')
    return _cors(request, response)


async def _carry(
    request: web.Request, principal: Principal, body: bytes
) -> web.StreamResponse | None:
    """Cluster mode: the owner node's answer to a session request not for this node."""
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is None or request.path.startswith("/internal/"):
        return None
    from whip.cluster_node import carry_session_request

    config = request.app[SESSIONS_KEY].config
    answer = await carry_session_request(request, cluster, config.cluster.secret, principal, body)
    return None if answer is None else _cors(request, answer)


@guarded
async def delete_session(request: web.Request) -> web.StreamResponse:
    """Close a session; idempotent through the tombstone."""
    return await serve_delete(request, await require_caller(request))


async def serve_delete(request: web.Request, principal: Principal) -> web.StreamResponse:
    """The DELETE of a session for ``principal`` (public or carried route)."""
    session_id = request.match_info["session_id"]
    manager = request.app[SESSIONS_KEY]
    session = manager.table.get(session_id) if is_session_id(session_id) else None
    if session is not None and (principal.is_operator or session.principal == principal.name):
        await manager.close(session, CloseReason.DELETED)
        return _cors(request, web.Response(status=200))
    stone = manager.table.tombstone(session_id)
    if stone is not None:
        return _cors(request, web.Response(status=200))
    if is_session_id(session_id) and (carried := await _carry(request, principal, b"")):
        return carried
    raise NotFoundError("session")


@guarded
async def patch_session(request: web.Request) -> web.StreamResponse:
    """Trickle ICE (204) or ICE restart (200 with a fragment and a new ``ETag``).

    ``If-Match`` (or Eyevinn's ``ETag`` request header) is judged inside the session's
    PATCH lock (:mod:`whip.session_patch`); the body is read and parsed before.
    """
    return await serve_patch(request, await require_caller(request))


async def serve_patch(request: web.Request, principal: Principal) -> web.StreamResponse:
    """The PATCH of a session for ``principal`` (public or carried route)."""
    session_id = request.match_info["session_id"]
    manager = request.app[SESSIONS_KEY]
    session = manager.table.get(session_id) if is_session_id(session_id) else None
    if session is None and is_session_id(session_id) and CLUSTER_KEY in request.app:
        body = await _read_body(request, MAX_FRAGMENT_BYTES, FragmentTooLargeError())
        if carried := await _carry(request, principal, body):
            return carried
    if session is None or not (principal.is_operator or session.principal == principal.name):
        raise NotFoundError("session")
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type != TRICKLE_CONTENT_TYPE:
        raise HttpError(
            f"PATCH takes {TRICKLE_CONTENT_TYPE}", http_status=415, code="unsupported_media_type"
        )
    body = await _read_body(request, MAX_FRAGMENT_BYTES, FragmentTooLargeError())
    fragment = parse_fragment(body)
    answer = await manager.patches.patch(
        session, fragment, request.headers.get("If-Match"), request.headers.get("ETag")
    )
    if answer.status == 204:
        return _cors(request, web.Response(status=204))
    response = web.Response(
        status=answer.status,
        body=answer.body.encode(),
        content_type=answer.content_type,
        headers={"ETag": answer.etag or ""},
    )
    return _cors(request, response)


async def options_whip(request: web.Request) -> web.StreamResponse:
    """CORS preflight and ``Accept-Post``."""
    response = web.Response(status=204)
    response.headers["Accept-Post"] = "application/sdp"
    if "session_id" in request.match_info:
        response.headers["Accept-Patch"] = TRICKLE_CONTENT_TYPE
    response.headers["Access-Control-Allow-Methods"] = "OPTIONS, POST, DELETE, PATCH"
    response.headers["Access-Control-Allow-Headers"] = ALLOW_HEADERS
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
