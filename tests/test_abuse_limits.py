"""Abuse limits (whip.ratelimit, whip.app): rate limits per address and per principal,
header and body size limits, the slow-body deadline, unguessable session URLs."""

from __future__ import annotations

import asyncio
import re
import string
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer, make_mocked_request

from tests.support.peers import AiortcPublisher
from tests.support.servers import make_config
from whip.appkeys import LIMITER_KEY
from whip.auth import Authenticator, hash_token
from whip.ids import new_id
from whip.ratelimit import RequestLimiter, TokenBuckets

Servers = Callable[..., Awaitable[TestServer]]
PRINCIPALS = [
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token("token-a")},
    {"name": "studio-b", "role": "publisher", "token_sha256": hash_token("token-b")},
    {"name": "ops", "role": "operator", "token_sha256": hash_token("token-ops")},
]
SLOW = 0.001  # tokens per second: a refused bucket stays refused for the whole test


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _post(http: aiohttp.ClientSession, server: TestServer, token: str | None = None) -> int:
    """A POST /whip that the handler refuses cheaply (415): it still costs a token."""
    headers = {"Content-Type": "text/plain", **_auth(token)}
    async with http.post(server.make_url("/whip"), data="x", headers=headers) as response:
        return response.status


async def _refused(response: aiohttp.ClientResponse) -> int:
    """Check a 429's shape; its Retry-After in seconds."""
    assert response.status == 429
    body = await response.json()
    assert body == {"error": {"code": "rate_limited", "message": body["error"]["message"]}}
    retry = response.headers["Retry-After"]
    assert retry.isdigit() and int(retry) >= 1
    return int(retry)


async def test_a_burst_over_the_address_limit_is_429_and_gets_are_not_limited(
    whip_servers: Servers,
) -> None:
    server = await whip_servers(limits__burst_per_address=5, limits__rate_per_address_per_s=SLOW)
    async with aiohttp.ClientSession() as http:
        statuses = [await _post(http, server) for _ in range(5)]
        assert statuses == [415] * 5
        # every limited method, on any path: the address bucket is shared
        for method, path in [
            ("POST", "/whip"),
            ("POST", "/whip/cam1"),
            ("PATCH", "/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA"),
            ("DELETE", "/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA"),
            ("DELETE", "/v1/runs/r_nope"),
            ("POST", "/v1/runs/r_nope/stop"),
        ]:
            async with http.request(method, server.make_url(path)) as response:
                retry = await _refused(response)
                assert retry > 100  # 1 token at 0.001/s
        for path in ("/healthz", "/v1/runs", "/v1/sessions", "/metrics", "/whip"):
            async with http.get(server.make_url(path)) as response:
                assert response.status != 429, path
    assert server.app[LIMITER_KEY].refused == 6


async def test_principal_buckets_are_per_principal_under_the_address_bucket(
    whip_servers: Servers,
) -> None:
    server = await whip_servers(
        PRINCIPALS,
        limits__burst_per_address=8,
        limits__rate_per_address_per_s=SLOW,
        limits__burst_per_principal=3,
        limits__rate_per_principal_per_s=SLOW,
    )
    history: list[tuple[str | None, int]] = []
    async with aiohttp.ClientSession() as http:
        for token in ["token-a"] * 4 + ["token-b"] * 4 + [None, "bad-token", None, "token-ops"]:
            history.append((token, await _post(http, server, token)))
    assert history == [
        ("token-a", 415),
        ("token-a", 415),
        ("token-a", 415),
        ("token-a", 429),  # studio-a's bucket; a refusal costs the address nothing
        ("token-b", 415),
        ("token-b", 415),
        ("token-b", 415),
        ("token-b", 429),
        (None, 401),  # no principal: the address bucket only (7 of 8)
        ("bad-token", 401),  # 8 of 8
        (None, 429),  # the address bucket is empty
        ("token-ops", 429),  # a fresh principal, but the same address
    ]


async def test_anonymous_mode_uses_the_address_bucket_only(whip_servers: Servers) -> None:
    server = await whip_servers(
        limits__burst_per_address=4,
        limits__rate_per_address_per_s=SLOW,
        limits__burst_per_principal=1,
        limits__rate_per_principal_per_s=SLOW,
    )
    async with aiohttp.ClientSession() as http:
        assert [await _post(http, server) for _ in range(5)] == [415] * 4 + [429]


async def test_requests_pass_again_after_retry_after(whip_servers: Servers) -> None:
    # One token a second: the burst is spent long before the next token, however loaded
    # the machine (at 20/s a token came back while the three POSTs ran).
    server = await whip_servers(limits__burst_per_address=3, limits__rate_per_address_per_s=1)
    async with aiohttp.ClientSession() as http:
        assert [await _post(http, server) for _ in range(3)] == [415] * 3
        async with http.post(server.make_url("/whip"), data="x") as response:
            retry = await _refused(response)
        assert retry == 1  # under 1 s, rounded up
        await asyncio.sleep(retry)
        assert await _post(http, server) == 415  # the token that came back


async def test_a_zero_rate_turns_the_limit_off(whip_servers: Servers) -> None:
    server = await whip_servers(limits__rate_per_address_per_s=0, limits__burst_per_principal=1)
    assert server.app[LIMITER_KEY].by_address is None
    async with aiohttp.ClientSession() as http:
        assert [await _post(http, server) for _ in range(20)] == [415] * 20


def test_bucket_table_is_capped_and_idle_buckets_expire() -> None:
    now = [1000.0]
    buckets = TokenBuckets(rate=1.0, burst=5, capacity=1000, clock=lambda: now[0])
    for n in range(10_000):
        key = f"10.0.{n // 256}.{n % 256}"
        assert buckets.wait(key) == 0
        buckets.take(key)
        assert len(buckets) <= 1000
    assert len(buckets) == 1000
    # the most recent keys are kept (one token spent), the oldest were evicted (full)
    assert buckets.wait("10.0.39.15") == 0 and buckets._tokens("10.0.39.15", now[0]) == 4
    assert buckets._tokens("10.0.0.0", now[0]) == 5
    # one key drained: refused, with the wait until its next token
    for _ in range(5):
        buckets.take("hot")
    assert buckets.wait("hot") == pytest.approx(1.0)
    now[0] += 0.5
    assert buckets.wait("hot") == pytest.approx(0.5)
    # idle past burst / rate: full again, so dropped on the next access
    now[0] += 5.0
    assert buckets.wait("other") == 0
    assert len(buckets) == 0


def test_forwarded_for_is_used_only_from_trusted_proxies(tmp_path: Path) -> None:
    config = make_config(tmp_path, limits__trusted_proxies=["10.0.0.0/8", "::1"])
    limiter = RequestLimiter(config.limits, Authenticator.from_config(config))

    def source(peer: str, forwarded: str | None) -> str:
        headers = {"X-Forwarded-For": forwarded} if forwarded else {}
        request = make_mocked_request("POST", "/whip", headers=headers)
        return limiter.source(request.clone(remote=peer))

    assert source("192.0.2.1", "198.51.100.7") == "192.0.2.1"  # untrusted peer
    assert source("10.1.2.3", "198.51.100.7") == "198.51.100.7"
    assert source("10.1.2.3", "203.0.113.9, 198.51.100.7, 10.9.9.9") == "198.51.100.7"
    assert source("10.1.2.3", "garbage") == "10.1.2.3"
    assert source("10.1.2.3", None) == "10.1.2.3"
    assert source("::1", "2001:db8::5") == "2001:db8::5"


async def test_a_huge_header_is_refused_with_a_4xx(whip_servers: Servers) -> None:
    server = await whip_servers(limits__max_header_bytes=4096)
    assert server.app._handler_args is not None
    assert server.app._handler_args["max_field_size"] == 4096
    async with aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/sdp", "X-Junk": "j" * 6000}
        async with http.post(server.make_url("/whip"), data="v=0\r\n", headers=headers) as r:
            # aiohttp answers this itself, before any middleware: plain text, not JSON
            assert 400 <= r.status < 500
        async with http.get(server.make_url("/healthz"), headers={"X-Ok": "o" * 3000}) as r:
            assert r.status == 200


async def test_an_oversized_sdp_body_is_413_json(whip_servers: Servers) -> None:
    server = await whip_servers()
    async with aiohttp.ClientSession() as http:
        for size in (40_000, 200_000):
            body = "v=0\r\n" + "a=x:" + "y" * size + "\r\n"
            headers = {"Content-Type": "application/sdp"}
            async with http.post(server.make_url("/whip"), data=body, headers=headers) as r:
                assert r.status == 413
                assert (await r.json())["error"]["code"] in ("sdp_too_large", "payload_too_large")


async def _raw(server: TestServer, head: str, body: bytes) -> tuple[bytes, float]:
    """Send ``head`` and ``body``, then read until the server closes; (reply, seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    started = time.monotonic()
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        async with asyncio.timeout(10):
            reply = await reader.read(-1)
        return reply, time.monotonic() - started
    finally:
        writer.close()


@pytest.mark.parametrize("sent", [b"", b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\n"])
async def test_a_slow_body_is_408_and_closed_within_the_deadline(
    whip_servers: Servers, sent: bytes
) -> None:
    server = await whip_servers(limits__body_timeout_s=0.5)
    head = (
        "POST /whip HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    reply, took = await _raw(server, head, sent)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert b'"request_timeout"' in reply
    assert 0.4 <= took < 3.0


async def test_a_slow_patch_body_is_408(whip_servers: Servers) -> None:
    server = await whip_servers(limits__body_timeout_s=0.5)
    head = (
        "PATCH /whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/trickle-ice-sdpfrag\r\nContent-Length: 500\r\n\r\n"
    )
    reply, took = await _raw(server, head, b"a=ice-ufrag:x\r\n")
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert took < 3.0


async def test_trickled_headers_are_cut_off_by_the_keepalive_timeout(
    whip_servers: Servers,
) -> None:
    server = await whip_servers(limits__keepalive_timeout_s=1)
    reply, took = await _raw(server, "POST /whip HTTP/1.1\r\nHost: 127", b"")
    assert reply == b"" and took < 4.0


def test_session_ids_are_unique_with_128_bits_from_the_csprng() -> None:
    ids = [new_id("s_") for _ in range(1000)]
    assert len(set(ids)) == 1000
    alphabet = set(string.ascii_letters + string.digits + "-_")
    for session_id in ids:
        token = session_id.removeprefix("s_")
        # 22 base64url characters encode 16 random bytes: 128 bits
        assert len(token) == 22 and set(token) <= alphabet


@pytest.mark.parametrize("count", [40, pytest.param(1000, marks=pytest.mark.slow)])
async def test_session_urls_of_real_posts_are_unique_tokens(
    whip_servers: Servers, count: int
) -> None:
    # limiter off: count POSTs + count DELETEs from one address
    server = await whip_servers(limits__rate_per_address_per_s=0, limits__stream_limit=100)
    offerer = AiortcPublisher()
    offer = await offerer.offer()
    await offerer.close()
    locations: list[str] = []
    async with aiohttp.ClientSession() as http:

        async def post(n: int) -> None:
            headers = {"Content-Type": "application/sdp"}
            url = server.make_url(f"/whip/stream{n}")
            async with http.post(url, data=offer, headers=headers) as response:
                assert response.status == 201, await response.text()
                location = response.headers["Location"]
            locations.append(location)
            async with http.delete(server.make_url(location)) as response:
                assert response.status == 200

        for first in range(0, count, 20):
            await asyncio.gather(*(post(n) for n in range(first, min(count, first + 20))))
    assert len(set(locations)) == count
    for location in locations:
        assert re.fullmatch(r"/whip/sessions/s_[A-Za-z0-9_-]{22}", location)
