"""The one place where errors become HTTP answers.

Domain errors (:class:`whip.errors.HttpError`, :class:`registry.errors.RegistryError`)
map to their own status; aiohttp's HTTP exceptions keep their status but get the JSON
shape; anything else is a 500 with a logged traceback. ``CancelledError`` is always
re-raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

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
    429: "rate_limited",
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
        return json_error(exc.status, exc.code, exc.message, exc.headers)
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
    except Exception:
        logger.exception("%s %s: unhandled error", request.method, request.path)
        return json_error(500, "internal", "internal server error")
