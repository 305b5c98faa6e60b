"""Bearer-token authentication and roles. Pure: header values in, principals out.

Rules:

- A principal is a name and a role: ``publisher`` (pushes streams, sees its own runs) or
  ``operator`` (sees, stops and deletes every run). Tokens are never stored: the config
  holds the hex SHA-256 of each one (:func:`hash_token`, :func:`generate_token`).
- ``Authorization: Bearer <token>`` (scheme case-insensitive, RFC 6750 token syntax).
  The token's SHA-256 is compared with every configured hash using
  :func:`hmac.compare_digest`, always all of them: the time taken does not depend on
  which entry, if any, matched.
- Missing, malformed or unknown token: 401 ``unauthorized`` with ``WWW-Authenticate``.
  Known token, insufficient role: 403 ``forbidden`` (:meth:`Authenticator.require`).
- Anonymous mode (no principals configured; config allows it only on loopback): every
  request is :data:`ANONYMOUS`, an operator, whatever its ``Authorization`` header says.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from whip.config import ANONYMOUS as ANONYMOUS_NAME
from whip.config import Config, PrincipalConfig
from whip.errors import HttpError

REALM = "whip-ingest"
MAX_TOKEN_LENGTH = 1024
_BEARER = re.compile(r"bearer +([A-Za-z0-9\-._~+/]+=*)", re.IGNORECASE)


class Role(StrEnum):
    PUBLISHER = "publisher"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. Operators may act on every run."""

    name: str
    role: Role

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR


ANONYMOUS = Principal(ANONYMOUS_NAME, Role.OPERATOR)


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
    """403: authenticated, but the role does not allow this."""

    http_status = 403
    code = "forbidden"


def hash_token(token: str) -> str:
    """Lowercase hex SHA-256 of ``token`` (UTF-8): what ``token_sha256`` holds."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class GeneratedToken(NamedTuple):
    token: str
    sha256: str

    def toml(self, name: str, role: Role | str = Role.PUBLISHER) -> str:
        """A ``[[principals]]`` entry for the config file (the token itself is not in it)."""
        lines = [
            f"name = {json.dumps(name)}",
            f'role = "{Role(role)}"',
            f'token_sha256 = "{self.sha256}"',
        ]
        return "[[principals]]\n" + "\n".join(lines) + "\n"


def generate_token(nbytes: int = 32) -> GeneratedToken:
    """A fresh random bearer token (URL-safe base64, ``nbytes`` of entropy) and its hash."""
    token = secrets.token_urlsafe(nbytes)
    return GeneratedToken(token, hash_token(token))


def parse_bearer(header: str | None) -> str:
    """The token of an ``Authorization`` header value; 401 when missing or malformed."""
    if header is None or not header.strip():
        raise UnauthorizedError("missing Authorization: Bearer token")
    match = _BEARER.fullmatch(header.strip())
    if match is None or len(match.group(1)) > MAX_TOKEN_LENGTH:
        raise UnauthorizedError("malformed Authorization header", invalid_token=True)
    return match.group(1)


class Authenticator:
    """Resolves ``Authorization`` header values to principals (module rules)."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        """``entries``: (hex SHA-256 of a token, its principal); none: anonymous mode."""
        self._entries = tuple((bytes.fromhex(digest), who) for digest, who in entries)
        if any(len(digest) != hashlib.sha256().digest_size for digest, _ in self._entries):
            raise ValueError("token hashes are hex SHA-256 digests")

    @classmethod
    def from_config(cls, config: Config | Iterable[PrincipalConfig]) -> Authenticator:
        principals = config.principals if isinstance(config, Config) else tuple(config)
        return cls((p.token_sha256, Principal(p.name, Role(p.role))) for p in principals)

    @property
    def anonymous(self) -> bool:
        return not self._entries

    def authenticate(self, header: str | None) -> Principal:
        """The principal of an ``Authorization`` header value; raises 401."""
        if self.anonymous:
            return ANONYMOUS
        digest = hashlib.sha256(parse_bearer(header).encode("utf-8")).digest()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(digest, stored) and found is None:
                found = principal
        if found is None:
            raise UnauthorizedError("unknown bearer token", invalid_token=True)
        return found

    def require(self, header: str | None, role: Role) -> Principal:
        """Authenticate, then 403 unless the principal has ``role`` (operators have all)."""
        principal = self.authenticate(header)
        require_role(principal, role)
        return principal


def require_role(principal: Principal, role: Role) -> None:
    """403 unless ``principal`` has ``role``; an operator has every role."""
    if principal.role is not role and not principal.is_operator:
        raise ForbiddenError(f"{principal.name} is a {principal.role}; this needs {role}")
