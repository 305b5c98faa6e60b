"""The one place where errors become HTTP answers.

Domain errors (:class:`whip.errors.HttpError`, :class:`registry.errors.RegistryError`)
map to their own status; aiohttp's HTTP exceptions keep their status but get the JSON
shape; a request body that aiohttp could not parse (bad chunking, a content coding that
does not decode) is 400 ``bad_body``; anything else is a 500 with a logged traceback.
``CancelledError`` is always re-raised.

:func:`json_error_prepare` (an ``on_response_prepare`` hook) gives the same shape to the
few error answers aiohttp's web layer makes outside the middleware chain: an ``Expect``
other than ``100-continue`` (417, from the route's expect handler). What aiohttp's HTTP
parser rejects never reaches the application at all (400, plain text, connection
closed; the list is in tests/test_http_fuzz.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.http import HttpProcessingError

from registry.errors import RegistryError
from whip.cors import add_cors, is_whip_path
from whip.errors import HttpError, error_body

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An error answer in the contract's JSON shape."""
    return web.json_response(error_body(code, message), status=status, headers=headers)


_REASON_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    417: "expectation_failed",
    429: "rate_limited",
    500: "internal",
}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure of ``handler`` to a JSON error answer (with CORS on WHIP paths,
    so a browser publisher can read a refusal's ``Retry-After``)."""
    response = await _answer(request, handler)
    if response.status >= 400 and is_whip_path(request.path):
        add_cors(request, response)
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except HttpError as exc:
        return json_error(exc.http_status, exc.code, exc.message, exc.headers)
    except RegistryError as exc:
        if exc.http_status >= 500:
            logger.error("%s %s: %s", request.method, request.path, exc)
        return json_error(exc.http_status, exc.code, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _REASON_CODES.get(exc.status, "http_error")
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return json_error(exc.status, code, exc.reason, headers)
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        # Raised by the body stream when the parser fails on a body that arrived after the
        # request was dispatched: the client's fault, and its connection is unusable.
        logger.info("%s %s: unreadable body: %s", request.method, request.path, exc)
        cause = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else exc
        detail = cause.message if isinstance(cause, HttpProcessingError) else str(cause)
        detail = detail.strip() or "malformed"
        response = json_error(400, "bad_body", f"request body could not be read: {detail}")
        response.force_close()
        return response
    except Exception:
        logger.exception("%s %s: unhandled error", request.method, request.path)
        return json_error(500, "internal", "internal server error")


async def json_error_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: an error answer that did not come from :func:`_answer`
    (aiohttp's web layer raised it before the middleware chain, e.g. 417 for an unknown
    ``Expect``) is rewritten to the JSON shape before its headers are sent."""
    if response.status < 400 or not isinstance(response, web.Response):
        return
    if response.content_type == "application/json":
        return
    code = _REASON_CODES.get(response.status, "http_error")
    raw = response.body
    text = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else ""
    body = json.dumps(error_body(code, text or response.reason)).encode()
    response.body = body
    response.content_type = "application/json"
    response.charset = "utf-8"
    response.headers[hdrs.CONTENT_LENGTH] = str(len(body))
    if is_whip_path(request.path):
        add_cors(request, response)
