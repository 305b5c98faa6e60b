"""The authentication of one aiohttp request: what it asks for, who asks, resolved once.

Rules:

- The action follows from the request (:func:`auth_request`): ``read`` for GET and HEAD,
  ``publish`` for the WHIP endpoint and session URLs (``/whip...``), ``operate`` for the
  rest (stopping and deleting runs). The stream is the push's (``POST /whip/{stream}``;
  ``""`` for ``POST /whip``), None for every other request.
- The caller's address is the rate limiter's (``X-Forwarded-For`` only from trusted
  proxies, :meth:`whip.ratelimit.RequestLimiter.source`); the user agent is cut to
  :data:`MAX_USER_AGENT` characters.
- A request is authenticated at most once (:func:`request_principal`): the outcome, a
  principal or the error, is kept on the request, so the rate limiter and the handler
  share one static lookup, JWT verification or hook call.
"""

from __future__ import annotations

from aiohttp import web

from whip.appkeys import AUTH_KEY, LIMITER_KEY
from whip.auth.principal import Action, AuthRequest, Principal, Role, require_role
from whip.errors import HttpError

MAX_USER_AGENT = 256

_OUTCOME: web.RequestKey[Principal | HttpError] = web.RequestKey("auth_outcome")


def auth_request(request: web.Request) -> AuthRequest:
    """What ``request`` asks for (module rules)."""
    stream: str | None = None
    if request.method in ("GET", "HEAD"):
        action = Action.READ
    elif request.path == "/whip" or request.path.startswith("/whip/"):
        action = Action.PUBLISH
        if request.method == "POST" and "session_id" not in request.match_info:
            stream = request.match_info.get("stream", "")
    else:
        action = Action.OPERATE
    limiter = request.app.get(LIMITER_KEY)
    remote = limiter.source(request) if limiter is not None else (request.remote or "")
    agent = request.headers.get("User-Agent", "")[:MAX_USER_AGENT]
    return AuthRequest(action, stream, remote, agent)


async def request_principal(request: web.Request) -> Principal:
    """The principal of ``request``, resolved once (module rules); raises its 401, 403 or
    503 (again, to each caller).

    Cancellation: nothing is kept; a later caller resolves afresh."""
    outcome = request.get(_OUTCOME)
    if outcome is None:
        auth = request.app[AUTH_KEY]
        try:
            outcome = await auth.resolve(
                request.headers.get("Authorization"), auth_request(request)
            )
        except HttpError as exc:
            outcome = exc
        request[_OUTCOME] = outcome
    if isinstance(outcome, HttpError):
        raise outcome
    return outcome


async def require_caller(request: web.Request, role: Role = Role.PUBLISHER) -> Principal:
    """The principal of ``request`` (401 first), then 403 unless it has ``role``."""
    principal = await request_principal(request)
    require_role(principal, role)
    return principal
