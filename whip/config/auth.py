"""``[auth]``: JWT bearer tokens (a JWKS) and an HTTP auth hook, beside ``[[principals]]``.

Rules:

- JWT is on when ``jwks_url`` or ``jwks_file`` is set (not both); then ``issuer`` and
  ``audience`` are required (a token minted for another service of the same identity
  provider must not be accepted here), and ``issuer``/``audience`` without a key set are
  refused as having no effect.
- ``algorithms`` lists the JWS algorithms accepted, from RS256, ES256 and EdDSA. ``none``
  (unsigned tokens) and every ``HS*`` (a shared secret: with a public key as the secret
  it is the algorithm-confusion attack) are refused by name; anything else is unknown.
- The hook is on when ``hook_url`` is set. URLs are ``http://`` or ``https://`` with a host.
- With JWT or the hook on, the server is not anonymous (:func:`auth_enabled`), whatever
  ``[[principals]]`` holds.
- Pure, as the rest of the schema: whether the JWKS file exists is checked at start-up
  (:meth:`whip.auth.Authenticator.from_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from whip.config.errors import ConfigError, InvalidValue
from whip.config.rule import Rule

JWT_ALGORITHMS = ("RS256", "ES256", "EdDSA")


def check_http_url(url: str) -> None:
    """Empty (off) or an ``http``/``https`` URL with a host."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a bad port
    except ValueError:
        raise InvalidValue(f"{url!r} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidValue(f"must be an http:// or https:// URL with a host, got {url!r}")


def check_algorithms(algorithms: tuple[str, ...]) -> None:
    """At least one of :data:`JWT_ALGORITHMS`, none twice; ``none`` and ``HS*`` refused."""
    if not algorithms:
        raise InvalidValue(f"must name at least one of {', '.join(JWT_ALGORITHMS)}")
    for name in algorithms:
        if name.lower() == "none":
            raise InvalidValue("'none' is refused: unsigned tokens are never accepted")
        if name.upper().startswith("HS"):
            raise InvalidValue(
                f"{name!r} is refused: a shared-secret algorithm beside public keys "
                "allows algorithm confusion"
            )
        if name not in JWT_ALGORITHMS:
            raise InvalidValue(f"{name!r} is not one of {', '.join(JWT_ALGORITHMS)}")
    if len(set(algorithms)) != len(algorithms):
        raise InvalidValue("lists an algorithm twice")


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """``[auth]``: JWT (a JWKS by URL or file) and the HTTP auth hook (module rules)."""

    jwks_url: str = ""
    jwks_file: str = ""
    issuer: str = ""
    audience: str = ""
    algorithms: tuple[str, ...] = JWT_ALGORITHMS
    jwks_timeout_s: float = 5.0
    jwks_refresh_s: float = 600.0
    hook_url: str = ""
    hook_cache_s: float = 10.0
    hook_timeout_s: float = 5.0

    RULES: ClassVar[dict[str, Rule]] = {
        "jwks_url": Rule(
            "URL of the JSON Web Key Set that signs JWT bearer tokens (empty: none)",
            check=check_http_url,
        ),
        "jwks_file": Rule("path of a JSON Web Key Set file, instead of jwks_url (empty: none)"),
        "issuer": Rule("the iss every JWT must carry (required with a JWKS)"),
        "audience": Rule("the aud every JWT must name (required with a JWKS)"),
        "algorithms": Rule(
            "JWS algorithms accepted: RS256, ES256, EdDSA (none and HS* are refused)",
            check=check_algorithms,
        ),
        "jwks_timeout_s": Rule("a JWKS fetch that takes longer fails (cached keys kept)", 0.1, 60),
        "jwks_refresh_s": Rule(
            "keys older than this are fetched again on the next token (a kid not in the "
            "set is fetched at most once a minute)",
            60,
            86400,
        ),
        "hook_url": Rule(
            "HTTP auth hook: POSTed each token the static principals and JWT do not admit "
            "(empty: none)",
            check=check_http_url,
        ),
        "hook_cache_s": Rule(
            "an admission of the hook is reused this long (refusals 1 s; 0: never)", 0, 3600
        ),
        "hook_timeout_s": Rule("a hook answer later than this refuses the request (503)", 0.1, 60),
    }

    @property
    def jwt_enabled(self) -> bool:
        return bool(self.jwks_url or self.jwks_file)

    @property
    def hook_enabled(self) -> bool:
        return bool(self.hook_url)


def auth_enabled(auth: AuthConfig) -> bool:
    """JWT or the hook is on: the server is not anonymous."""
    return auth.jwt_enabled or auth.hook_enabled


def check_auth(auth: AuthConfig, refuse: Callable[[str, str], ConfigError]) -> None:
    """The ``[auth]`` refusals that involve more than one key (module rules);
    ``refuse(dotted_key, message)`` builds the error naming the key's source."""
    if auth.jwks_url and auth.jwks_file:
        raise refuse("auth.jwks_file", "set jwks_url or jwks_file, not both")
    if auth.jwt_enabled:
        jwks = "auth.jwks_url" if auth.jwks_url else "auth.jwks_file"
        for key in ("issuer", "audience"):
            if not getattr(auth, key):
                # Blamed on the key that was set (the missing one has no source).
                raise refuse(
                    jwks,
                    f"needs auth.{key} (tokens of another issuer or for another audience "
                    "must not be accepted)",
                )
    else:
        for key in ("issuer", "audience"):
            if getattr(auth, key):
                raise refuse(f"auth.{key}", "has no effect without auth.jwks_url or jwks_file")
