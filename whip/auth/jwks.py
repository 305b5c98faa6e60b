"""The JSON Web Key Set that verifies JWT bearer tokens: fetched, parsed, cached.

Rules:

- Source: ``auth.jwks_url`` (GET with aiohttp, ``auth.jwks_timeout_s`` for the whole
  exchange, no redirect followed, a 200 of at most :data:`MAX_JWKS_BYTES`) or
  ``auth.jwks_file`` (read at start-up, where a missing or unusable file refuses to
  start; later reads run in a thread).
- Usable keys: RSA, EC P-256 and OKP Ed25519 public keys whose algorithm (the JWK's
  ``alg``, or the one its type implies) is in ``auth.algorithms``; ``use`` absent or
  ``sig``. Symmetric (``oct``) keys are never loaded: no token is verified with a shared
  secret. At most :data:`MAX_KEYS` keys are kept (the cache's bound); the rest of a larger
  set is ignored, with a warning.
- A set with no usable key, a non-200 answer, a timeout or unparsable JSON is a failed
  fetch: the keys already cached are kept, whatever their age.
- Fetches, single-flight (one lock): when the cache is empty or older than
  ``auth.jwks_refresh_s``, at most one attempt per :data:`RETRY_S` while they fail; when a
  token names a ``kid`` no cached key has, at most one per :data:`UNKNOWN_KID_REFETCH_S`
  (a known ``kid`` with another algorithm is refused without a fetch).
- A token without ``kid`` is verified with the set's only key of its algorithm, if there
  is exactly one.
- Everything runs on the event loop; lookups are dictionary reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import jwt

from whip.auth.principal import AuthUnavailableError
from whip.config import ConfigError
from whip.config.auth import AuthConfig

logger = logging.getLogger(__name__)

MAX_JWKS_BYTES = 256 * 1024
MAX_KEYS = 64
RETRY_S = 5.0
UNKNOWN_KID_REFETCH_S = 60.0


class JwksError(Exception):
    """A key set that could not be fetched or holds no usable key."""


def parse_jwks(raw: bytes, algorithms: tuple[str, ...]) -> list[jwt.PyJWK]:
    """The usable keys of a JWKS document (module rules); raises :class:`JwksError`."""
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JwksError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwksError('not a JWKS (an object with a "keys" array)')
    entries: list[Any] = document["keys"]
    keys: list[jwt.PyJWK] = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kty") == "oct":
            continue
        if entry.get("use", "sig") != "sig":
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as exc:
            logger.warning("JWKS key %r skipped: %s", entry.get("kid"), exc)
            continue
        if key.algorithm_name not in algorithms:
            continue
        if len(keys) == MAX_KEYS:
            logger.warning("JWKS has more than %d usable keys; the rest are ignored", MAX_KEYS)
            break
        keys.append(key)
    if not keys:
        raise JwksError(f"no usable key (algorithms {', '.join(algorithms)})")
    return keys


async def _fetch_url(http: aiohttp.ClientSession, url: str, timeout_s: float) -> bytes:
    """The body of a 200 answer from ``url`` (module rules). Cancellation: the request is
    abandoned and its connection closed."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with http.get(url, timeout=timeout, allow_redirects=False) as response:
            if response.status != 200:
                raise JwksError(f"answered {response.status}")
            if (response.content_length or 0) > MAX_JWKS_BYTES:
                raise JwksError(f"larger than {MAX_JWKS_BYTES} bytes")
            body = await response.content.read(MAX_JWKS_BYTES + 1)
            while len(body) <= MAX_JWKS_BYTES:
                chunk = await response.content.read(MAX_JWKS_BYTES + 1 - len(body))
                if not chunk:
                    break
                body += chunk
            if len(body) > MAX_JWKS_BYTES:
                raise JwksError(f"larger than {MAX_JWKS_BYTES} bytes")
            return body
    except TimeoutError as exc:
        raise JwksError(f"no answer within {timeout_s:g} s") from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise JwksError(f"unreachable: {type(exc).__name__}: {exc}") from exc


class JwksCache:
    """The verification keys of one key set, by ``kid`` (module rules).

    Event loop only. ``clock`` is monotonic seconds (injected by tests of the refetch
    bounds).
    """

    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._keys: list[jwt.PyJWK] = []
        self._loaded_at: float | None = None
        self._last_attempt: float | None = None
        self._last_kid_refetch: float | None = None
        self._lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        self.fetches = 0
        """Fetch attempts so far (successful or not)."""
        self.source = config.jwks_url or config.jwks_file
        if config.jwks_file:
            self._load_file_at_start(Path(config.jwks_file))

    def _load_file_at_start(self, path: Path) -> None:
        try:
            raw = path.read_bytes()
            self._install(parse_jwks(raw, self.config.algorithms))
        except (OSError, JwksError) as exc:
            raise ConfigError(
                f"auth.jwks_file {str(path)!r}: {exc}", key="auth.jwks_file", source=str(path)
            ) from exc

    def _install(self, keys: list[jwt.PyJWK]) -> None:
        self._keys = keys
        self._loaded_at = self._clock()
        kids = ", ".join(str(k.key_id) for k in keys)
        logger.info("JWKS %s: %d keys (%s)", self.source, len(keys), kids)

    def _find(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        candidates = [k for k in self._keys if k.algorithm_name == algorithm]
        if kid is None:
            return candidates[0] if len(candidates) == 1 else None
        return next((k for k in candidates if k.key_id == kid), None)

    def _stale(self, now: float) -> bool:
        if self._last_attempt is not None and now - self._last_attempt < RETRY_S:
            return False
        return self._loaded_at is None or now - self._loaded_at >= self.config.jwks_refresh_s

    async def key_for(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        """The key that verifies a token of ``algorithm`` naming ``kid``; None when the set
        has none (after the refetch the module rules allow). 503 when no key set was ever
        loaded.

        Cancellation: a fetch under way goes on for the next caller only if it was not
        this one's (the lock is released; a cancelled fetch counts as failed)."""
        if self._stale(self._clock()):
            await self._refresh(unknown_kid=False)
        if self._loaded_at is None:
            raise AuthUnavailableError("the JWT key set could not be fetched")
        key = self._find(kid, algorithm)
        if key is None and kid is not None and not any(k.key_id == kid for k in self._keys):
            last = self._last_kid_refetch
            if last is None or self._clock() - last >= UNKNOWN_KID_REFETCH_S:
                await self._refresh(unknown_kid=True)
                key = self._find(kid, algorithm)
        return key

    async def _refresh(self, *, unknown_kid: bool) -> None:
        async with self._lock:
            now = self._clock()
            if unknown_kid:
                last = self._last_kid_refetch
                if last is not None and now - last < UNKNOWN_KID_REFETCH_S:
                    return  # another caller refetched while this one waited
                self._last_kid_refetch = now
            elif not self._stale(now):
                return
            self._last_attempt = now
            self.fetches += 1
            try:
                raw = await self._read()
                keys = parse_jwks(raw, self.config.algorithms)
            except JwksError as exc:
                logger.warning(
                    "JWKS %s: fetch failed (%s); keeping %d cached keys",
                    self.source,
                    exc,
                    len(self._keys),
                )
                return
            self._install(keys)

    async def _read(self) -> bytes:
        if self.config.jwks_file:
            try:
                return await asyncio.to_thread(Path(self.config.jwks_file).read_bytes)
            except OSError as exc:
                raise JwksError(f"unreadable: {exc}") from exc
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return await _fetch_url(self._http, self.config.jwks_url, self.config.jwks_timeout_s)

    async def close(self) -> None:
        """Close the HTTP client, if one was opened. Idempotent."""
        if self._http is not None:
            await self._http.close()
            self._http = None
