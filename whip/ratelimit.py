"""Abuse limits on the mutating routes: rate limits and the body read deadline.

Rules:

- Token buckets (RFC 9725 section 4.4 asks for rate limits): one per source address and
  one per principal. A request passes only when both of its buckets hold a token; then
  it takes one from each (checked first, taken together: a refused request costs
  nothing). Refusal: 429 ``rate_limited`` with ``Retry-After`` = seconds until both
  buckets hold a token, rounded up (at least 1).
- Limited: ``POST /whip``, ``POST /whip/{stream}``, ``PATCH``/``DELETE`` of a WHIP session
  URL, ``DELETE /v1/runs/{id}``, ``POST /v1/runs/{id}/stop`` (the handlers carry
  :func:`guarded`). GETs are never limited.
- A rate of 0 turns that bucket kind off. The principal bucket applies only to requests
  whose token resolves to a principal: in anonymous mode every caller is ``anonymous``,
  so only the address bucket applies; a bad or missing token is charged to the address
  only (and answered 401 by the handler). The address bucket is judged before the token
  is resolved, so a refused address costs no JWT verification and no auth-hook call;
  the resolution is the request's one (:func:`whip.auth.request_principal`).
- Source address: ``request.remote``. ``X-Forwarded-For`` is used only when the peer is
  listed in ``limits.trusted_proxies`` (addresses or networks): then the client is the
  rightmost entry that is not itself a trusted proxy (the peer if none is usable).
- Bounded memory: a bucket table holds at most ``limits.rate_table_capacity`` keys,
  least recently used evicted first (an evicted key starts again with a full bucket).
  A bucket idle long enough to be full again (burst / rate seconds) is dropped, which
  changes nothing it would answer; the sweep runs from the least recently used end on
  every access, so its cost is amortized O(1).
- Slow bodies: a POST/PATCH body (up to :data:`PREBUFFER_MAX_BYTES`, or chunked) is
  buffered before the handler runs; one that has not fully arrived within
  ``limits.body_timeout_s`` of the headers is answered 408 ``request_timeout`` and the
  connection is closed after the answer (the error is set on the body stream and is also
  a ``TimeoutError``, which aiohttp's lingering read treats as "give up and close"). A
  larger declared body goes to the handler (which answers 413 from its first bytes)
  with the same deadline armed on its stream. A chunked body above aiohttp's read-pause
  mark (128 KiB) cannot finish buffering and is answered 408 at the deadline.
  Trickled headers are bounded by aiohttp's ``keepalive_timeout``
  (``limits.keepalive_timeout_s``), which also runs before a connection's first request.
  A body the parser has already failed on (a content coding that does not decode) is
  not waited for: its error is raised at once (400 ``bad_body`` from the middleware).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from whip.appkeys import LIMITER_KEY
from whip.auth import Authenticator, request_principal
from whip.config import LimitsConfig
from whip.errors import HttpError

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class RateLimitedError(HttpError):
    """Too many requests from one address or principal (429, ``Retry-After``)."""

    http_status = 429
    code = "rate_limited"


class BodyTimeoutError(HttpError, TimeoutError):
    """The request body did not arrive in time (408)."""

    http_status = 408
    code = "request_timeout"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class TokenBuckets:
    """Token buckets by key: ``rate`` tokens per second up to ``burst``; at most
    ``capacity`` keys (LRU eviction), idle full buckets dropped (module rules).

    Not thread-safe: used from the event loop only.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1 or capacity < 1:
            raise ValueError("rate > 0, burst >= 1 and capacity >= 1 are required")
        self.rate = float(rate)
        self.burst = float(burst)
        self.capacity = capacity
        self.idle_s = self.burst / self.rate
        self._clock = clock
        self._table: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def _sweep(self, now: float) -> None:
        table = self._table
        while table:
            bucket = next(iter(table.values()))
            if now - bucket.stamp < self.idle_s:
                break
            table.popitem(last=False)

    def _tokens(self, key: str, now: float) -> float:
        bucket = self._table.get(key)
        if bucket is None:
            return self.burst
        return min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)

    def wait(self, key: str, now: float | None = None) -> float:
        """Seconds until ``key`` holds one token (0: it holds one now)."""
        now = self._clock() if now is None else now
        self._sweep(now)
        missing = 1.0 - self._tokens(key, now)
        return max(0.0, missing / self.rate)

    def take(self, key: str, now: float | None = None) -> None:
        """Take one token from ``key`` (the caller checked :meth:`wait` first)."""
        now = self._clock() if now is None else now
        tokens = self._tokens(key, now) - 1.0
        table = self._table
        if key in table:
            table.move_to_end(key)
        table[key] = _Bucket(tokens, now)
        while len(table) > self.capacity:
            table.popitem(last=False)


def _network(spec: str) -> Network:
    return ipaddress.ip_network(spec.strip(), strict=False)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None


class RequestLimiter:
    """The per-address and per-principal buckets of one application."""

    def __init__(
        self,
        limits: LimitsConfig,
        auth: Authenticator,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.auth = auth
        self._clock = clock
        capacity = limits.rate_table_capacity
        self.by_address = (
            TokenBuckets(limits.rate_per_address_per_s, limits.burst_per_address, capacity, clock)
            if limits.rate_per_address_per_s > 0
            else None
        )
        self.by_principal = (
            TokenBuckets(
                limits.rate_per_principal_per_s, limits.burst_per_principal, capacity, clock
            )
            if limits.rate_per_principal_per_s > 0
            else None
        )
        self.trusted = tuple(_network(spec) for spec in limits.trusted_proxies)
        self.refused = 0
        """Requests answered 429 (loop thread only; exported by /metrics)."""
        self.body_timeouts = 0
        """Requests answered 408 because their body did not arrive in time."""

    def _trusted(self, text: str | None) -> bool:
        address = _address(text) if text else None
        return address is not None and any(address in net for net in self.trusted)

    def source(self, request: web.Request) -> str:
        """The client address (module rules for ``X-Forwarded-For``)."""
        peer = request.remote or "unknown"
        if not self.trusted or not self._trusted(peer):
            return peer
        hops = ",".join(request.headers.getall("X-Forwarded-For", [])).split(",")
        for hop in reversed([h.strip() for h in hops if h.strip()]):
            address = _address(hop)
            if address is None:
                break
            if not self._trusted(hop):
                return str(address)
        return peer

    async def principal(self, request: web.Request) -> str | None:
        """The principal a request's token names; None for anonymous mode or a bad token
        (or a hook that cannot answer: the handler answers that).

        Cancellation: nothing to undo (:func:`whip.auth.request_principal`)."""
        if self.auth.anonymous:
            return None
        try:
            return (await request_principal(request)).name
        except HttpError:
            return None

    async def check(self, request: web.Request) -> None:
        """Take a token from each of the request's buckets, or raise 429.

        Cancellation: nothing was taken."""
        if self.by_address is None and self.by_principal is None:
            return
        charges: list[tuple[TokenBuckets, str]] = []
        if self.by_address is not None:
            charges.append((self.by_address, self.source(request)))
            self._refuse_if_waiting(request, charges, None, self._clock())
        name = await self.principal(request) if self.by_principal is not None else None
        if self.by_principal is not None and name is not None:
            charges.append((self.by_principal, name))
        now = self._clock()
        self._refuse_if_waiting(request, charges, name, now)
        for buckets, key in charges:
            buckets.take(key, now)

    def _refuse_if_waiting(
        self,
        request: web.Request,
        charges: list[tuple[TokenBuckets, str]],
        name: str | None,
        now: float,
    ) -> None:
        wait = max((buckets.wait(key, now) for buckets, key in charges), default=0.0)
        if wait > 0:
            self.refused += 1
            retry = max(1, math.ceil(wait))
            logger.info(
                "%s %s from %s (%s): rate limited, retry in %d s",
                request.method,
                request.path,
                request.remote,
                name,
                retry,
            )
            raise RateLimitedError(
                f"too many requests; retry in {retry} s", headers={"Retry-After": str(retry)}
            )


PREBUFFER_MAX_BYTES = 64 * 1024
"""Bodies up to this size are buffered before the handler runs (below aiohttp's
read-pause mark of twice its 64 KiB read buffer, so waiting cannot stall on flow
control); a declared ``Content-Length`` above it is left to the handler's own 413."""


def _expire_body(request: web.Request, timeout_s: float) -> BodyTimeoutError | None:
    """Fail the body stream of ``request`` unless it has arrived; the error, if set."""
    content = request.content
    if content.is_eof():
        return None
    logger.info("%s %s from %s: body too slow", request.method, request.path, request.remote)
    error = BodyTimeoutError(f"request body not received within {timeout_s:g} s")
    content.set_exception(error)
    return error


async def _await_body(request: web.Request, timeout_s: float) -> asyncio.TimerHandle | None:
    """Wait until a POST/PATCH body is buffered, at most ``timeout_s`` (408 after).

    Returns the deadline timer that still guards a body not buffered here (a declared
    length above :data:`PREBUFFER_MAX_BYTES`): it fails the stream when it fires.

    Cancellation: nothing to undo; the stream is left as it is.
    """
    content = request.content
    if request.method not in ("POST", "PATCH") or content.is_eof():
        return None
    failed = content.exception()
    if failed is not None:  # the parser already failed on the body (wait_eof would hang)
        raise failed
    length = request.content_length
    if length is not None and length > PREBUFFER_MAX_BYTES:
        loop = asyncio.get_running_loop()
        return loop.call_later(timeout_s, _expire_body, request, timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            await content.wait_eof()
    except TimeoutError:
        error = _expire_body(request, timeout_s)
        if error is not None:
            raise error from None
    return None


def guarded(handler: Handler) -> Handler:
    """Apply the rate limits and the body deadline (module rules) to ``handler``.

    Cancellation: propagates; a pending deadline timer is cancelled once the body has
    arrived, else it still fires (so aiohttp's lingering read after the answer stops).
    """

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        limiter = request.app[LIMITER_KEY]
        await limiter.check(request)
        try:
            timer = await _await_body(request, limiter.limits.body_timeout_s)
        except BodyTimeoutError:
            limiter.body_timeouts += 1
            raise
        try:
            return await handler(request)
        finally:
            if timer is not None and request.content.is_eof():
                timer.cancel()

    return wrapper
