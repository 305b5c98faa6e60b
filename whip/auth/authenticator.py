"""The chain that resolves a bearer token: static tokens, then JWT, then the hook.

Rules:

- Anonymous mode (no principals, no JWT, no hook; the config allows it only on loopback):
  every request is :data:`~whip.auth.principal.ANONYMOUS`, an operator, whatever its
  ``Authorization`` header says.
- Otherwise the header must hold a bearer token (401 when missing or malformed), tried in
  this order, the first that recognizes it deciding:
  1. the static ``[[principals]]`` hashes (constant time over all of them);
  2. JWT, when a key set is configured and the token has a JWT's shape: a valid token
     decides; a refused one (expired, bad signature, wrong issuer, ...) goes on to the
     hook when one is configured, else its 401 is the answer;
  3. the hook, when configured: it decides (admission, 401, 403, or 503).
  Nothing recognized: 401 ``unknown bearer token`` (or the JWT's own refusal).
- A push (:class:`~whip.auth.principal.AuthRequest` with a stream) by a principal whose
  ``streams`` do not cover the stream is 403, after the principal was resolved (401 first).
- A token is never logged, stored, or put in an error message; the hook cache keeps only
  its hash (:mod:`whip.auth.hook`).
- Event loop only. JWT verification runs on the loop (:mod:`whip.auth.jwt_tokens`).
- The methods are coroutines named :meth:`~Authenticator.resolve` and
  :meth:`~Authenticator.resolve_requiring` (they were the synchronous ``authenticate`` and
  ``require``): a caller written for the old ones fails loudly (no such attribute) instead
  of dropping an un-awaited check.
"""

from __future__ import annotations

from collections.abc import Iterable

from whip.auth.hook import AuthHook
from whip.auth.jwks import JwksCache
from whip.auth.jwt_tokens import JwtVerifier, looks_like_jwt
from whip.auth.principal import (
    ANONYMOUS,
    AuthRequest,
    Principal,
    Role,
    UnauthorizedError,
    require_role,
    require_stream,
)
from whip.auth.static import StaticTokens, parse_bearer
from whip.config import Config, PrincipalConfig

_READ = AuthRequest()


class Authenticator:
    """Resolves ``Authorization`` header values to principals (module rules)."""

    def __init__(
        self,
        entries: Iterable[tuple[str, Principal]] = (),
        *,
        jwt: JwtVerifier | None = None,
        hook: AuthHook | None = None,
    ) -> None:
        """``entries``: (hex SHA-256 of a token, its principal); ``jwt``, ``hook``: the
        other authorities, if configured. None of the three: anonymous mode."""
        self.static = StaticTokens(entries)
        self.jwt = jwt
        self.hook = hook

    @classmethod
    def from_config(cls, config: Config | Iterable[PrincipalConfig]) -> Authenticator:
        """The chain the config describes. A ``jwks_file`` is read here: a missing or
        unusable one raises :class:`whip.config.ConfigError`."""
        principals = config.principals if isinstance(config, Config) else tuple(config)
        entries = [(p.token_sha256, Principal(p.name, Role(p.role))) for p in principals]
        if not isinstance(config, Config):
            return cls(entries)
        auth = config.auth
        jwt = JwtVerifier(auth, JwksCache(auth)) if auth.jwt_enabled else None
        hook = AuthHook(auth) if auth.hook_enabled else None
        return cls(entries, jwt=jwt, hook=hook)

    @property
    def anonymous(self) -> bool:
        return not self.static and self.jwt is None and self.hook is None

    async def resolve(self, header: str | None, request: AuthRequest = _READ) -> Principal:
        """The principal of an ``Authorization`` header value for ``request``; raises
        401, 403 (a push outside the token's streams) or 503 (the hook or key set could
        not answer).

        Cancellation: nothing to undo; a hook call goes on for its other waiters."""
        if self.anonymous:
            return ANONYMOUS
        token = parse_bearer(header)
        principal = self.static.lookup(token)
        refusal: UnauthorizedError | None = None
        if principal is None and self.jwt is not None and looks_like_jwt(token):
            try:
                principal = await self.jwt.verify(token)
            except UnauthorizedError as exc:
                refusal = exc
        if principal is None and self.hook is not None:
            principal = await self.hook.check(token, request)
        if principal is None:
            raise refusal or UnauthorizedError("unknown bearer token", invalid_token=True)
        if request.stream is not None:
            require_stream(principal, request.stream)
        return principal

    async def resolve_requiring(
        self, header: str | None, role: Role, request: AuthRequest = _READ
    ) -> Principal:
        """Authenticate, then 403 unless the principal has ``role`` (operators have all)."""
        principal = await self.resolve(header, request)
        require_role(principal, role)
        return principal

    async def close(self) -> None:
        """Close the HTTP clients of the key set and the hook. Idempotent."""
        if self.jwt is not None:
            await self.jwt.keys.close()
        if self.hook is not None:
            await self.hook.close()
