"""The HTTP auth hook: a platform's own service decides who may do what.

Rules:

- Asked for tokens the static principals and JWT did not admit: ``POST auth.hook_url``
  with the JSON ``{"token", "action", "stream", "remote_addr", "user_agent"}``
  (``action`` ``publish`` | ``read`` | ``operate``; ``stream`` the stream a push names, ``""``
  for ``POST /whip``, null for requests that name none).
- Answers: a 2xx whose JSON body is ``{"principal": <principal name>, "role":
  "publisher" | "operator"}`` (``role`` may be left out: publisher) admits. 401 and every
  other 4xx refuse (401), 403 refuses as forbidden (403). Anything else is a broken hook
  and refuses with 503, never admits: a timeout (``auth.hook_timeout_s`` for the whole
  exchange), a connection error, a redirect (never followed), a 1xx/3xx/5xx, a 2xx body
  that is not such an object or is larger than :data:`MAX_ANSWER_BYTES`.
- Cache: an admission is reused for ``auth.hook_cache_s``, a refusal for
  :data:`REFUSAL_CACHE_S` (at most ``hook_cache_s``; 0 caches nothing); 503s are never
  cached, so a hook that recovers admits at once. Keyed by the SHA-256 of the token,
  the action and the stream: the raw token is held only while its request is asked.
  At most :data:`MAX_CACHE_ENTRIES` answers, least recently used evicted first.
- Single flight: concurrent requests with one key share one hook call.
- Event loop only. The token is never logged; log lines name the action, the stream and
  the outcome.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from whip.auth.principal import (
    AuthRequest,
    AuthUnavailableError,
    ForbiddenError,
    Principal,
    Role,
    UnauthorizedError,
)
from whip.config import ANONYMOUS
from whip.config.auth import AuthConfig
from whip.errors import HttpError
from whip.names import is_principal_name

logger = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 16 * 1024
MAX_CACHE_ENTRIES = 4096
REFUSAL_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """What the hook said: an admitted principal, or the error to answer with (built
    afresh for each request: a cached refusal is raised many times)."""

    principal: Principal | None
    refusal: type[HttpError] | None = None
    message: str = ""

    @property
    def cacheable(self) -> bool:
        return self.refusal is not AuthUnavailableError

    def error(self) -> HttpError:
        if self.refusal is UnauthorizedError:
            return UnauthorizedError(self.message, invalid_token=True)
        assert self.refusal is not None
        return self.refusal(self.message)


class _BrokenHookError(Exception):
    """The hook's answer is none of the module's admissions or refusals."""


def cache_key(token: str, request: AuthRequest) -> bytes:
    """SHA-256 of the token, the action and the stream (module rules)."""
    material = json.dumps([token, request.action.value, request.stream])
    return hashlib.sha256(material.encode("utf-8")).digest()


def parse_admission(body: bytes) -> Principal:
    """The principal of a 2xx body; :class:`_BrokenHookError` when it is not one."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BrokenHookError("answer is not JSON") from exc
    if not isinstance(answer, dict):
        raise _BrokenHookError("answer is not a JSON object")
    name, role = answer.get("principal"), answer.get("role", Role.PUBLISHER.value)
    if not isinstance(name, str) or not is_principal_name(name) or name == ANONYMOUS:
        raise _BrokenHookError("principal is not a principal name")
    if role not in (Role.PUBLISHER.value, Role.OPERATOR.value):
        raise _BrokenHookError("role is not publisher or operator")
    return Principal(name, Role(role))


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    if (response.content_length or 0) > MAX_ANSWER_BYTES:
        raise _BrokenHookError(f"answer larger than {MAX_ANSWER_BYTES} bytes")
    body = b""
    while len(body) <= MAX_ANSWER_BYTES:
        chunk = await response.content.read(MAX_ANSWER_BYTES + 1 - len(body))
        if not chunk:
            return body
        body += chunk
    raise _BrokenHookError(f"answer larger than {MAX_ANSWER_BYTES} bytes")


class AuthHook:
    """Asks the configured hook, with the cache and single flight of the module rules.

    ``clock`` is monotonic seconds (the cache's expiry).
    """

    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = config.hook_url
        self.cache_s = config.hook_cache_s
        self.refusal_cache_s = min(REFUSAL_CACHE_S, config.hook_cache_s)
        self.timeout = aiohttp.ClientTimeout(total=config.hook_timeout_s)
        self._clock = clock
        self._cache: OrderedDict[bytes, tuple[float, HookAnswer]] = OrderedDict()
        self._in_flight: dict[bytes, asyncio.Task[HookAnswer]] = {}
        self._http: aiohttp.ClientSession | None = None
        self.calls = 0
        """Requests sent to the hook so far."""

    def __len__(self) -> int:
        return len(self._cache)

    async def check(self, token: str, request: AuthRequest) -> Principal:
        """The principal the hook admits for ``token`` and ``request``; raises its refusal
        (401, 403) or 503.

        Cancellation: the hook call runs on for the other requests that share it (it is a
        task of its own), and its answer is still cached."""
        key = cache_key(token, request)
        answer = self._cached(key)
        if answer is None:
            task = self._in_flight.get(key)
            if task is None:
                task = asyncio.create_task(self._ask(key, token, request), name="auth-hook")
                self._in_flight[key] = task
                task.add_done_callback(lambda _: self._in_flight.pop(key, None))
            answer = await asyncio.shield(task)
        if answer.principal is None:
            raise answer.error()
        return answer.principal

    def _cached(self, key: bytes) -> HookAnswer | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        expires, answer = entry
        if self._clock() >= expires:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return answer

    def _remember(self, key: bytes, answer: HookAnswer) -> None:
        ttl = self.cache_s if answer.principal is not None else self.refusal_cache_s
        if not answer.cacheable or ttl <= 0:
            return
        self._cache[key] = (self._clock() + ttl, answer)
        self._cache.move_to_end(key)
        while len(self._cache) > MAX_CACHE_ENTRIES:
            self._cache.popitem(last=False)

    async def _ask(self, key: bytes, token: str, request: AuthRequest) -> HookAnswer:
        answer = await self._call(token, request)
        self._remember(key, answer)
        outcome = answer.principal.name if answer.principal else answer.message
        logger.info(
            "auth hook: %s stream %r from %s: %s",
            request.action,
            request.stream,
            request.remote_addr,
            outcome,
        )
        return answer

    async def _call(self, token: str, request: AuthRequest) -> HookAnswer:
        payload = {
            "token": token,
            "action": request.action.value,
            "stream": request.stream,
            "remote_addr": request.remote_addr,
            "user_agent": request.user_agent,
        }
        if self._http is None:
            self._http = aiohttp.ClientSession()
        self.calls += 1
        try:
            async with self._http.post(
                self.url, json=payload, timeout=self.timeout, allow_redirects=False
            ) as response:
                status = response.status
                if 200 <= status < 300:
                    return HookAnswer(parse_admission(await _read_bounded(response)))
        except TimeoutError:
            return _unavailable(f"no answer within {self.timeout.total:g} s")
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return _unavailable(f"unreachable ({type(exc).__name__})")
        except _BrokenHookError as exc:
            return _unavailable(str(exc))
        if status == 403:
            return HookAnswer(None, ForbiddenError, "the auth hook refuses this action")
        if 400 <= status < 500:
            return HookAnswer(None, UnauthorizedError, "refused by the auth hook")
        return _unavailable(f"answered {status}")

    async def close(self) -> None:
        """Close the HTTP client, if one was opened. Idempotent."""
        if self._http is not None:
            await self._http.close()
            self._http = None


def _unavailable(why: str) -> HookAnswer:
    logger.warning("auth hook failed: %s", why)
    return HookAnswer(None, AuthUnavailableError, f"the auth hook could not answer: {why}")
