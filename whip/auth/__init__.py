"""Authentication and roles: the one entry point the routes call.

Rules (each module states its own in full):

- Who: a :class:`Principal` (name, role ``publisher`` | ``operator``, optionally the
  streams it may push) resolved from ``Authorization: Bearer <token>`` by the
  :class:`Authenticator` chain: static hashed tokens, then JWT (a JWKS), then the HTTP
  auth hook (:mod:`whip.auth.authenticator`).
- Answers: 401 for a missing, malformed, unknown, expired or badly signed token; 403 for a
  role or stream the caller lacks; 503 when the hook or the key set cannot answer (never
  an admission). Always the JSON error body of :mod:`whip.middleware`.
- A token never appears in a log line, an event or an error message.
- Routes call :func:`require_caller` (or :func:`request_principal`): one resolution per
  request, shared with the rate limiter (:mod:`whip.auth.caller`).

Modules: :mod:`~whip.auth.principal` (principals, actions, errors),
:mod:`~whip.auth.static` (hashed tokens, the bearer header), :mod:`~whip.auth.jwks` (the
key set), :mod:`~whip.auth.jwt_tokens` (JWT verification), :mod:`~whip.auth.hook` (the
auth hook), :mod:`~whip.auth.authenticator` (the chain), :mod:`~whip.auth.caller` (one
aiohttp request).
"""

from whip.auth.authenticator import Authenticator
from whip.auth.caller import auth_request, request_principal, require_caller
from whip.auth.principal import (
    ANONYMOUS,
    REALM,
    Action,
    AuthRequest,
    AuthUnavailableError,
    ForbiddenError,
    Principal,
    Role,
    UnauthorizedError,
    require_role,
    require_stream,
)
from whip.auth.static import (
    MAX_TOKEN_LENGTH,
    GeneratedToken,
    StaticTokens,
    generate_token,
    hash_token,
    parse_bearer,
)

__all__ = [
    "ANONYMOUS",
    "MAX_TOKEN_LENGTH",
    "REALM",
    "Action",
    "AuthRequest",
    "AuthUnavailableError",
    "Authenticator",
    "ForbiddenError",
    "GeneratedToken",
    "Principal",
    "Role",
    "StaticTokens",
    "UnauthorizedError",
    "auth_request",
    "generate_token",
    "hash_token",
    "parse_bearer",
    "request_principal",
    "require_caller",
    "require_role",
    "require_stream",
]
