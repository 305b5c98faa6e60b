"""JWT bearer tokens (RFC 7519) verified with the configured key set (PyJWT).

Rules:

- A token is tried as a JWT only when it has the shape of one (three base64url parts, the
  first a JSON object): other tokens go on to the next authority of the chain.
- The header's ``alg`` must be one of ``auth.algorithms`` (RS256, ES256, EdDSA at most;
  never ``none``, never ``HS*``: the config refuses them) and equal the algorithm of the
  key that verifies it, found by ``kid`` (:mod:`whip.auth.jwks`). An HS256 token signed
  with a public key as the secret is therefore refused before any key is used.
- Claims: ``exp``, ``iss`` (= ``auth.issuer``), ``aud`` (contains ``auth.audience``) and
  ``sub`` are required; ``exp``, ``nbf`` and ``iat`` are checked with :data:`LEEWAY_S` of
  clock skew. ``sub`` is the principal (the principal-name rule; not ``anonymous``);
  ``role`` is ``publisher`` (the default) or ``operator``; ``streams``, when present, a list
  of at most :data:`~whip.auth.principal.MAX_STREAM_PATTERNS` stream names or glob
  patterns.
- Every refusal is 401 with a fixed message saying which rule failed; no message holds a
  part of the token.
- CPU: a verification runs on the event loop: about 0.3-0.45 ms with PyJWT for each of
  RS256, ES256 and EdDSA on this project's 2-core machine (``bench/auth.py``; the
  signature is a third of it, PyJWT's parsing the rest), too little for a thread hand-off.
  Since every API call of a client carries its token again, a verified token is cached:
  keyed by its SHA-256 (never the token), for at most :data:`VERIFIED_TTL_S` and never
  past its ``exp``, at most :data:`MAX_VERIFIED` tokens (least recently used evicted). A
  key removed from the JWKS therefore stops admitting within that TTL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jwt

from whip.auth.jwks import JwksCache
from whip.auth.principal import (
    MAX_STREAM_PATTERNS,
    Principal,
    Role,
    UnauthorizedError,
    is_stream_pattern,
)
from whip.config import ANONYMOUS
from whip.config.auth import AuthConfig
from whip.names import is_principal_name

LEEWAY_S = 30.0
VERIFIED_TTL_S = 60.0
MAX_VERIFIED = 4096

_REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "JWT expired"),
    (jwt.ImmatureSignatureError, "JWT not yet valid"),
    (jwt.InvalidIssuerError, "JWT of another issuer"),
    (jwt.InvalidAudienceError, "JWT for another audience"),
    (jwt.InvalidSignatureError, "JWT signature does not verify"),
    (jwt.MissingRequiredClaimError, "JWT lacks a required claim (exp, iss, aud, sub)"),
)


def _refused(message: str) -> UnauthorizedError:
    return UnauthorizedError(message, invalid_token=True)


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts, the first a base64url JSON object."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts[:2]):
        return False
    head = parts[0]
    try:
        decoded = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
        return isinstance(json.loads(decoded), dict)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return False


def principal_of(claims: dict[str, Any]) -> Principal:
    """The principal a verified token's claims name (module rules); 401 otherwise."""
    sub = claims.get("sub")
    if not isinstance(sub, str) or not is_principal_name(sub) or sub == ANONYMOUS:
        raise _refused("JWT sub is not a principal name")
    role = claims.get("role", Role.PUBLISHER.value)
    if role not in (Role.PUBLISHER.value, Role.OPERATOR.value):
        raise _refused("JWT role must be publisher or operator")
    streams = claims.get("streams")
    if streams is not None and not (
        isinstance(streams, list)
        and len(streams) <= MAX_STREAM_PATTERNS
        and all(isinstance(s, str) and is_stream_pattern(s) for s in streams)
    ):
        raise _refused("JWT streams must be a list of stream names or patterns")
    return Principal(sub, Role(role), None if streams is None else tuple(streams))


class JwtVerifier:
    """Verifies JWT bearer tokens against one key set (module rules)."""

    def __init__(
        self,
        config: AuthConfig,
        keys: JwksCache,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: monotonic seconds, the verified cache's expiry (injected by tests)."""
        self.config = config
        self.keys = keys
        self._clock = clock
        self._options: Any = {"require": ["exp", "iss", "aud", "sub"]}
        self._verified: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()
        self.verifications = 0
        """Signature verifications so far (cache misses that reached PyJWT)."""

    async def verify(self, token: str) -> Principal:
        """The principal of ``token``; 401 for any rule it fails, 503 when no key set
        could ever be loaded. A token verified before is answered from the cache.

        Cancellation: only a key-set fetch can be under way (:meth:`JwksCache.key_for`)."""
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        cached = self._verified.get(digest)
        if cached is not None:
            if self._clock() < cached[0]:
                self._verified.move_to_end(digest)
                return cached[1]
            del self._verified[digest]
        principal, expires_at = await self._verify(token)
        ttl = min(VERIFIED_TTL_S, expires_at - time.time())
        if ttl > 0:
            self._verified[digest] = (self._clock() + ttl, principal)
            while len(self._verified) > MAX_VERIFIED:
                self._verified.popitem(last=False)
        return principal

    async def _verify(self, token: str) -> tuple[Principal, float]:
        """The principal of ``token`` and its ``exp`` (epoch seconds), verified."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise _refused("malformed JWT") from None
        algorithm, kid = header.get("alg"), header.get("kid")
        if not isinstance(algorithm, str) or algorithm not in self.config.algorithms:
            accepted = ", ".join(self.config.algorithms)
            raise _refused(f"JWT algorithm not accepted (accepted: {accepted})")
        if kid is not None and not isinstance(kid, str):
            raise _refused("JWT kid must be a string")
        key = await self.keys.key_for(kid, algorithm)
        if key is None:
            raise _refused("JWT signed by a key not in the key set")
        self.verifications += 1
        try:
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=[algorithm],
                audience=self.config.audience,
                issuer=self.config.issuer,
                leeway=LEEWAY_S,
                options=self._options,
            )
        except jwt.PyJWTError as exc:
            message = next((m for kind, m in _REFUSALS if isinstance(exc, kind)), "invalid JWT")
            raise _refused(message) from None
        return principal_of(claims), float(claims["exp"])
