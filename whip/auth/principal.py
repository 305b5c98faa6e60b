"""Who is calling, what they ask to do, and the errors authentication answers with.

Rules:

- A principal is a name, a role and, optionally, the streams it may publish. Roles:
  ``publisher`` (pushes streams, sees its own runs) and ``operator`` (sees, stops and
  deletes every run). ``streams`` is None for "any stream" (static tokens, the hook) or a
  tuple of stream names and glob patterns (a JWT's ``streams`` claim, :mod:`fnmatch`
  syntax, case-sensitive); a publish outside it is 403. An operator's ``streams`` is
  ignored: operators may act on every run.
- An action is what a request asks for: ``publish`` (the WHIP endpoint and the session
  URL), ``read`` (every GET of the API) or ``operate`` (stopping and deleting runs).
  :class:`AuthRequest` carries it, with the stream a push names (``""`` for ``POST
  /whip``; None for every other request) and the caller's address and user agent, for
  the auth hook. Only a push is checked against ``streams``.
- Errors by status: 401 :class:`UnauthorizedError` (missing, malformed, unknown, expired or
  badly signed token; with ``WWW-Authenticate``), 403 :class:`ForbiddenError` (a known
  caller whose role or ``streams`` does not allow this), 503 :class:`AuthUnavailableError`
  (the auth hook or the key set could not answer; never an admission). Messages are
  fixed texts: no token, and no claim of one, is ever part of them.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from enum import StrEnum

from whip.config import ANONYMOUS as ANONYMOUS_NAME
from whip.errors import HttpError

REALM = "whip-ingest"
MAX_STREAM_PATTERNS = 64
_STREAM_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!-]{1,64}")


class Role(StrEnum):
    PUBLISHER = "publisher"
    OPERATOR = "operator"


class Action(StrEnum):
    """What a request asks for (module rules)."""

    PUBLISH = "publish"
    READ = "read"
    OPERATE = "operate"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. Operators may act on every run; ``streams`` limits a publisher."""

    name: str
    role: Role
    streams: tuple[str, ...] | None = None

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR

    def may_publish(self, stream: str) -> bool:
        """Whether this principal may push ``stream`` (module rules)."""
        if self.streams is None or self.is_operator:
            return True
        return any(fnmatch.fnmatchcase(stream, pattern) for pattern in self.streams)


ANONYMOUS = Principal(ANONYMOUS_NAME, Role.OPERATOR)


def is_stream_pattern(text: str) -> bool:
    """A stream name or glob pattern a ``streams`` claim may hold."""
    return _STREAM_PATTERN.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What a request asks for, as the auth chain and the hook see it (module rules)."""

    action: Action = Action.READ
    stream: str | None = None
    remote_addr: str = ""
    user_agent: str = ""


class UnauthorizedError(HttpError):
    """401: no usable credentials. Carries the ``WWW-Authenticate`` challenge."""

    http_status = 401
    code = "unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        challenge = f'Bearer realm="{REALM}"'
        if invalid_token:
            challenge += ', error="invalid_token"'
        super().__init__(message, headers={"WWW-Authenticate": challenge})


class ForbiddenError(HttpError):
    """403: authenticated, but the role or the token's streams do not allow this."""

    http_status = 403
    code = "forbidden"


class AuthUnavailableError(HttpError):
    """503: the auth hook or the key set could not answer; the request is refused."""

    http_status = 503
    code = "auth_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})


def require_role(principal: Principal, role: Role) -> None:
    """403 unless ``principal`` has ``role``; an operator has every role."""
    if principal.role is not role and not principal.is_operator:
        raise ForbiddenError(f"{principal.name} is a {principal.role}; this needs {role}")


def require_stream(principal: Principal, stream: str) -> None:
    """403 unless ``principal`` may publish ``stream``."""
    if not principal.may_publish(stream):
        shown = repr(stream) if stream else "the unnamed stream (POST /whip)"
        raise ForbiddenError(f"the token of {principal.name} does not allow publishing {shown}")
