"""The HTTP auth hook through the real server (admit, refuse, forbid, timeout, garbage,
redirect, oversized, error: each its status; the cache counted at the hook), its cache
expiry and single flight with an injected clock, and the rule that a token never
appears in a log line, an event or the WAL (static, JWT and hook tokens, a real push)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.auth_peers import AUDIENCE, ISSUER, HookServer, SigningKey, jwks_document
from tests.support.eventually import eventually
from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import TIMELINE_KEY
from whip.auth import Action, AuthRequest, Principal, Role, UnauthorizedError, hash_token
from whip.auth.hook import AuthHook
from whip.config import AuthConfig

Servers = Callable[..., Awaitable[TestServer]]
AGENT = {"User-Agent": "whip-test/1"}


@pytest.fixture
async def hook() -> AsyncIterator[HookServer]:
    server = await HookServer().start()
    yield server
    await server.close()


def _every_file(root: Path) -> bytes:
    """The bytes of every file under ``root`` (the server's data dir: WAL, thumbnails)."""
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **AGENT}


async def test_hook_answers_each_get_their_status_and_admissions_are_cached(
    whip_servers: Servers, hook: HookServer
) -> None:
    server = await whip_servers(auth__hook_url=hook.url, auth__hook_timeout_s=0.3)
    runs = server.make_url("/v1/runs")
    seen: list[tuple[str, int, str]] = []
    publisher, offerer = AiortcPublisher(), AiortcPublisher()
    try:
        offer = await offerer.offer(audio=False)
    finally:
        await offerer.close()
    async with aiohttp.ClientSession() as http:

        async def call(case: str, method: str, url: Any, token: str, **kw: Any) -> None:
            async with http.request(method, url, headers=_bearer(token), **kw) as r:
                code = (await r.json())["error"]["code"] if r.status >= 400 else ""
                seen.append((case, r.status, code))

        for _ in range(3):
            await call("admit (read)", "GET", runs, "admit.1")
        for _ in range(2):
            await call("refuse", "GET", runs, "refuse.1")
        whip_headers = {"Content-Type": "application/sdp"}
        async with http.post(
            server.make_url("/whip/cam-1"),
            data=offer,
            headers={**whip_headers, **_bearer("forbid.1")},
        ) as r:
            seen.append(("forbid (publish)", r.status, (await r.json())["error"]["code"]))
        stop = server.make_url("/v1/runs/run-unknown/stop")
        await call("operator (operate), no such run", "POST", stop, "operator.1")
        for case in ("hang", "garbage", "badname", "badrole", "redirect", "huge", "error", "error"):
            await call(case, "GET", runs, f"{case}.1")
        try:
            pushed = await publisher.publish(
                http, str(server.make_url("/whip/cam-9")), _bearer("admit.2")
            )
            seen.append(("admit (publish), a real push", pushed.status, ""))
        finally:
            await publisher.close()
    unavailable = (503, "auth_unavailable")
    assert seen == [
        ("admit (read)", 200, ""),
        ("admit (read)", 200, ""),
        ("admit (read)", 200, ""),
        ("refuse", 401, "unauthorized"),
        ("refuse", 401, "unauthorized"),
        ("forbid (publish)", 403, "forbidden"),
        ("operator (operate), no such run", 404, "not_found"),
        ("hang", *unavailable),
        ("garbage", *unavailable),
        ("badname", *unavailable),
        ("badrole", *unavailable),
        ("redirect", *unavailable),
        ("huge", *unavailable),
        ("error", *unavailable),
        ("error", *unavailable),
        ("admit (publish), a real push", 201, ""),
    ]
    calls = {t: hook.calls(t) for t in ("admit.1", "refuse.1", "error.1", "admit.2")}
    assert calls == {"admit.1": 1, "refuse.1": 1, "error.1": 2, "admit.2": 1}
    assert hook.elsewhere_calls == 0  # the redirect was not followed
    asked = {body["token"]: {k: v for k, v in body.items() if k != "token"} for body in hook.bodies}
    origin = {"remote_addr": "127.0.0.1", "user_agent": AGENT["User-Agent"]}
    assert asked["admit.1"] == {"action": "read", "stream": None, **origin}
    assert asked["forbid.1"] == {"action": "publish", "stream": "cam-1", **origin}
    assert asked["operator.1"] == {"action": "operate", "stream": None, **origin}
    assert asked["admit.2"] == {"action": "publish", "stream": "cam-9", **origin}


async def test_hook_cache_expiry_and_single_flight(hook: HookServer) -> None:
    now = [0.0]
    auth = AuthHook(AuthConfig(hook_url=hook.url, hook_cache_s=10), clock=lambda: now[0])
    read = AuthRequest(Action.READ)
    history: list[tuple[str, str, int]] = []

    async def ask(case: str, token: str, request: AuthRequest = read) -> None:
        try:
            outcome = (await auth.check(token, request)).name
        except UnauthorizedError:
            outcome = "401"
        history.append((case, outcome, hook.calls(token)))

    try:
        await ask("admitted", "admit.c")
        now[0] += 9.9
        await ask("cached 9.9 s later", "admit.c")
        await ask("another action: asked", "admit.c", AuthRequest(Action.PUBLISH, "cam"))
        now[0] += 0.2
        await ask("expired after 10 s", "admit.c")
        await ask("refused", "refuse.c")
        now[0] += 0.9
        await ask("refusal cached 0.9 s later", "refuse.c")
        now[0] += 0.2
        await ask("refusal expired after 1 s", "refuse.c")
        waiters = [asyncio.create_task(auth.check("hang.c", read)) for _ in range(5)]
        await eventually(lambda: hook.calls("hang.c") == 1, within=5, awaiting="the hook call")
        hook.release.set()
        admitted = await asyncio.gather(*waiters)
        history.append(("5 at once", admitted[0].name, hook.calls("hang.c")))
    finally:
        await auth.close()
    assert admitted == [Principal("late", Role.OPERATOR)] * 5
    assert history == [
        ("admitted", "hook-studio", 1),
        ("cached 9.9 s later", "hook-studio", 1),
        ("another action: asked", "hook-studio", 2),
        ("expired after 10 s", "hook-studio", 3),
        ("refused", "401", 1),
        ("refusal cached 0.9 s later", "401", 1),
        ("refusal expired after 1 s", "401", 2),
        ("5 at once", "late", 1),
    ]


async def test_no_token_in_logs_events_or_wal(
    whip_servers: Servers,
    hook: HookServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    for name in ("whip", "aiohttp"):
        caplog.set_level(logging.DEBUG, logger=name)
    key = SigningKey.generate("ES256", "es-secrecy")
    jwks = tmp_path / "jwks.json"
    jwks.write_bytes(jwks_document(key))
    static = "static-secret-token-41"
    principals = [{"name": "ops", "role": "operator", "token_sha256": hash_token(static)}]
    server = await whip_servers(
        principals=principals,
        auth__jwks_file=str(jwks),
        auth__issuer=ISSUER,
        auth__audience=AUDIENCE,
        auth__hook_url=hook.url,
    )
    pusher = key.mint(sub="studio-secret")
    tokens = {
        "static": static,
        "jwt": pusher,
        "expired jwt": key.mint(exp=1_000_000, iat=999_000),
        "hook": "admit.secret-9f3a",
        "refused": "refuse.secret-77c1",
    }
    publisher = AiortcPublisher()
    statuses = {}
    async with aiohttp.ClientSession() as http:
        try:
            pushed = await publisher.publish(
                http, str(server.make_url("/whip/cam-s")), _bearer(pusher)
            )
            assert pushed.status == 201
            await asyncio.wait_for(publisher.connected.wait(), 15)
            await wait_for_type(server.app[TIMELINE_KEY], publisher.run_id, "first_frame")
            for case, token in tokens.items():
                async with http.get(server.make_url("/v1/runs"), headers=_bearer(token)) as r:
                    statuses[case] = r.status
            session = server.make_url(publisher.location)
            async with http.delete(session, headers=_bearer(pusher)) as r:
                assert r.status == 200
        finally:
            await publisher.close()
        events_url = server.make_url(f"/v1/runs/{publisher.run_id}/events")
        async with http.get(events_url, headers=_bearer(static)) as r:
            events = await r.text()
    assert statuses == {"static": 200, "jwt": 200, "expired jwt": 401, "hook": 200, "refused": 401}
    assert '"principal":"studio-secret"' in events.replace(" ", "")
    wal = await asyncio.to_thread(_every_file, tmp_path / "servers")
    logged = caplog.text + "".join(repr(r.args) for r in caplog.records)
    assert "auth hook" in logged  # the hook's lines were captured
    for case, token in tokens.items():
        assert token not in logged, case
        assert token not in events, case
        assert token.encode() not in wal, case


async def test_one_hook_call_per_request_and_none_for_a_rate_limited_address(
    whip_servers: Servers, hook: HookServer
) -> None:
    server = await whip_servers(
        auth__hook_url=hook.url,
        auth__hook_cache_s=0,  # no cache: every hook call is a request's own
        limits__rate_per_address_per_s=0.001,
        limits__burst_per_address=2,
    )
    seen: list[tuple[int, int]] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(
                server.make_url("/whip/cam-1"),
                data="v=0\r\n",
                headers={"Content-Type": "application/sdp", **_bearer("forbid.r")},
            ) as r:
                seen.append((r.status, hook.calls("forbid.r")))
    # the rate limiter and the handler share one resolution; a refused address costs none
    assert seen == [(403, 1), (403, 2), (429, 2)]
