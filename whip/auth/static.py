"""Static hashed bearer tokens: the ``[[principals]]`` of the config. Pure.

Rules:

- Tokens are never stored: the config holds the hex SHA-256 of each one
  (:func:`hash_token`, :func:`generate_token`).
- ``Authorization: Bearer <token>`` (scheme case-insensitive, RFC 6750 token syntax, at
  most :data:`MAX_TOKEN_LENGTH` characters: a JWT with a ``streams`` list fits).
  Missing or malformed: 401 (:func:`parse_bearer`).
- Lookup: the token's SHA-256 is compared with every configured hash using
  :func:`hmac.compare_digest`, always all of them: the time taken does not depend on
  which entry, if any, matched. No match is None: the next authority of the chain
  (:mod:`whip.auth.authenticator`) may know the token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from typing import NamedTuple

from whip.auth.principal import Principal, Role, UnauthorizedError

MAX_TOKEN_LENGTH = 4096
_BEARER = re.compile(r"bearer +([A-Za-z0-9\-._~+/]+=*)", re.IGNORECASE)


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


class StaticTokens:
    """The configured token hashes and their principals (module rules)."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        """``entries``: (hex SHA-256 of a token, its principal)."""
        self._entries = tuple((bytes.fromhex(digest), who) for digest, who in entries)
        if any(len(digest) != hashlib.sha256().digest_size for digest, _ in self._entries):
            raise ValueError("token hashes are hex SHA-256 digests")

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> Principal | None:
        """The principal of ``token``; None when no entry holds its hash."""
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(digest, stored) and found is None:
                found = principal
        return found
