"""JWT bearer tokens through the real server: a JWKS file and a JWKS URL on loopback,
RS256, ES256 and EdDSA, and every refusal with its status (a real WHIP POST for
publish, the runs listing for read, a stop for operate); the key set's refetch bounds
with an injected clock; the ``[auth]`` config refusals."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.auth_peers import (
    AUDIENCE,
    ISSUER,
    JwksServer,
    SigningKey,
    jwks_document,
)
from tests.support.peers import AiortcPublisher
from whip.auth import Authenticator, AuthUnavailableError
from whip.auth.jwks import JwksCache
from whip.auth.jwt_tokens import VERIFIED_TTL_S, JwtVerifier
from whip.config import AuthConfig, ConfigError, build_config

Servers = Callable[..., Awaitable[TestServer]]


@pytest.fixture(scope="module")
def keys() -> dict[str, SigningKey]:
    """The signing keys of this module (RSA generation is the slow part: once)."""
    return {
        "rs": SigningKey.generate("RS256", "rs-1"),
        "es": SigningKey.generate("ES256", "es-1"),
        "ed": SigningKey.generate("EdDSA", "ed-1"),
        "rs2": SigningKey.generate("RS256", "rs-2"),
        "rogue": SigningKey.generate("RS256", "rs-1"),  # the kid of rs, another key
    }


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _handmade(header: dict[str, Any], secret: bytes | None) -> str:
    """A token the signing libraries refuse to make: ``alg: none`` (no signature) or
    HS256 keyed with ``secret`` (the algorithm-confusion attack)."""
    now = int(time.time())
    claims = {"sub": "studio-j", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    if secret is None:
        return signing_input + "."
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(mac)}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def jwks_server(keys: dict[str, SigningKey]) -> AsyncIterator[JwksServer]:
    server = await JwksServer([keys["rs"], keys["es"]]).start()
    yield server
    await server.close()


async def test_jwks_file_tokens_each_get_their_status(
    whip_servers: Servers, keys: dict[str, SigningKey], tmp_path: Path
) -> None:
    rs, es, ed, rogue = keys["rs"], keys["es"], keys["ed"], keys["rogue"]
    jwks = tmp_path / "jwks.json"
    jwks.write_bytes(jwks_document(rs, es, ed))
    server = await whip_servers(
        auth__jwks_file=str(jwks), auth__issuer=ISSUER, auth__audience=AUDIENCE
    )
    now = int(time.time())
    refused = {
        "expired": rs.mint(exp=now - 120, iat=now - 400),
        "not yet valid": rs.mint(nbf=now + 600),
        "issued in the future": es.mint(iat=now + 600),
        "wrong issuer": rs.mint(iss="https://other-idp.test/"),
        "wrong audience": es.mint(aud="another-service"),
        "wrong key": rogue.mint(),
        "unknown kid": rogue.mint(kid="nobody"),
        "alg none": _handmade({"alg": "none", "typ": "JWT", "kid": "rs-1"}, None),
        "HS256 keyed with the public key": _handmade(
            {"alg": "HS256", "typ": "JWT", "kid": "rs-1"}, rs.public_pem()
        ),
        "no exp": rs.mint(exp=None),
        "sub not a principal name": ed.mint(sub="../studio"),
        "role unknown": ed.mint(role="admin"),
        "streams not a list": ed.mint(streams="cam-1"),
        "not a JWT at all": "eyJhbGciOiJSUzI1NiJ9.garbage.sig",
    }
    publisher, offerer = AiortcPublisher(), AiortcPublisher()
    try:
        offer = await offerer.offer(audio=False)
    finally:
        await offerer.close()
    statuses: dict[str, tuple[int, str]] = {}
    async with aiohttp.ClientSession() as http:
        url = server.make_url("/whip/cam-1")
        headers = {"Content-Type": "application/sdp"}
        for case, token in refused.items():
            async with http.post(url, data=offer, headers={**headers, **_bearer(token)}) as r:
                body = await r.json()
                statuses[case] = (r.status, body["error"]["code"])
                assert r.headers["WWW-Authenticate"].endswith('error="invalid_token"'), case
        assert statuses == dict.fromkeys(refused, (401, "unauthorized"))

        # read: each algorithm, and a token without kid (the set's only RS256 key)
        readers = {
            "RS256": rs.mint(),
            "ES256": es.mint(),
            "EdDSA": ed.mint(),
            "RS256 without kid": rs.mint(kid=None),
        }
        for case, token in readers.items():
            async with http.get(server.make_url("/v1/runs"), headers=_bearer(token)) as r:
                statuses[case] = (r.status, "")
        # publish: a stream outside the token's streams is 403; inside it, a real push
        limited = es.mint(sub="studio-cams", streams=["cam-*", "studio"])
        async with http.post(
            server.make_url("/whip/other-1"), data=offer, headers={**headers, **_bearer(limited)}
        ) as r:
            statuses["outside streams"] = (r.status, (await r.json())["error"]["code"])
        try:
            pushed = await publisher.publish(http, str(url), _bearer(limited))
            statuses["inside streams"] = (pushed.status, "")
            # read and operate: a publisher sees only itself, an operator all and stops
            others = server.make_url("/v1/runs").with_query(principal="studio-cams")
            async with http.get(others, headers=_bearer(rs.mint())) as r:
                statuses["publisher lists another"] = (r.status, (await r.json())["error"]["code"])
            operator = ed.mint(sub="ops-j", role="operator")
            async with http.get(others, headers=_bearer(operator)) as r:
                listed = [run["id"] for run in (await r.json())["items"]]
                statuses["operator lists another"] = (r.status, "")
            stop = server.make_url(f"/v1/runs/{publisher.run_id}/stop")
            async with http.post(stop, headers=_bearer(rs.mint())) as r:
                statuses["publisher stops another's run"] = (r.status, "")
            async with http.post(stop, headers=_bearer(operator)) as r:
                statuses["operator stops it"] = (r.status, "")
        finally:
            await publisher.close()
    assert {k: v for k, v in statuses.items() if k not in refused} == {
        "RS256": (200, ""),
        "ES256": (200, ""),
        "EdDSA": (200, ""),
        "RS256 without kid": (200, ""),
        "outside streams": (403, "forbidden"),
        "inside streams": (201, ""),
        "publisher lists another": (403, "forbidden"),
        "operator lists another": (200, ""),
        "publisher stops another's run": (404, ""),
        "operator stops it": (200, ""),
    }
    assert listed == [publisher.run_id]


async def test_jwks_url_is_fetched_once_refetched_once_for_a_new_kid_and_kept_when_down(
    whip_servers: Servers, keys: dict[str, SigningKey], jwks_server: JwksServer
) -> None:
    server = await whip_servers(
        auth__jwks_url=jwks_server.url,
        auth__issuer=ISSUER,
        auth__audience=AUDIENCE,
        auth__jwks_timeout_s=2.0,
    )
    history: list[tuple[str, int, int]] = []
    async with aiohttp.ClientSession() as http:

        async def read(case: str, token: str) -> None:
            async with http.get(server.make_url("/v1/runs"), headers=_bearer(token)) as r:
                history.append((case, r.status, jwks_server.gets))

        await read("RS256", keys["rs"].mint())
        await read("ES256", keys["es"].mint())
        await read("kid not served yet", keys["rs2"].mint())
        jwks_server.keys.append(keys["rs2"])
        await read("kid served, within the minute", keys["rs2"].mint())
        jwks_server.down = True
        await read("JWKS down, cached key", keys["rs"].mint())
    assert history == [
        ("RS256", 200, 1),
        ("ES256", 200, 1),
        ("kid not served yet", 401, 2),
        ("kid served, within the minute", 401, 2),
        ("JWKS down, cached key", 200, 2),
    ]


async def test_key_set_refetch_bounds_with_a_clock(
    keys: dict[str, SigningKey], jwks_server: JwksServer
) -> None:
    now = [1000.0]
    config = AuthConfig(
        jwks_url=jwks_server.url, issuer=ISSUER, audience=AUDIENCE, jwks_refresh_s=600
    )
    cache = JwksCache(config, clock=lambda: now[0])
    history: list[tuple[str, bool, int]] = []

    async def look(case: str, kid: str, algorithm: str = "RS256") -> None:
        found = await cache.key_for(kid, algorithm)
        history.append((case, found is not None, jwks_server.gets))

    try:
        await look("first token", "rs-1")
        await look("its kid, another algorithm", "rs-1", "ES256")
        await look("unknown kid", "rs-2")
        jwks_server.keys.append(keys["rs2"])
        now[0] += 59
        await look("served now, 59 s later", "rs-2")
        now[0] += 2
        await look("a minute later", "rs-2")
        jwks_server.down = True
        now[0] += 601
        await look("stale, JWKS down: kept", "rs-1")
        await look("again at once: no new attempt", "rs-1")
    finally:
        await cache.close()
    assert history == [
        ("first token", True, 1),
        ("its kid, another algorithm", False, 1),
        ("unknown kid", False, 2),
        ("served now, 59 s later", False, 2),
        ("a minute later", True, 3),
        ("stale, JWKS down: kept", True, 4),
        ("again at once: no new attempt", True, 4),
    ]


async def test_verified_tokens_are_cached_within_their_ttl_and_exp(
    keys: dict[str, SigningKey], tmp_path: Path
) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_bytes(jwks_document(keys["rs"]))
    config = AuthConfig(jwks_file=str(jwks), issuer=ISSUER, audience=AUDIENCE)
    now = [0.0]
    verifier = JwtVerifier(config, JwksCache(config), clock=lambda: now[0])
    long_lived, short_lived = keys["rs"].mint(), keys["rs"].mint(exp=int(time.time()) + 20)
    history: list[tuple[str, int]] = []

    async def verify(case: str, token: str) -> None:
        assert (await verifier.verify(token)).name == "studio-j"
        history.append((case, verifier.verifications))

    await verify("first", long_lived)
    await verify("again", long_lived)
    await verify("another token", short_lived)
    now[0] += 25
    await verify("past the other's exp (re-verified)", short_lived)
    await verify("within the TTL", long_lived)
    now[0] += VERIFIED_TTL_S
    await verify("past the TTL", long_lived)
    assert history == [
        ("first", 1),
        ("again", 1),
        ("another token", 2),
        ("past the other's exp (re-verified)", 3),
        ("within the TTL", 3),
        ("past the TTL", 4),
    ]


async def test_an_unanswering_jwks_is_a_503_within_its_timeout() -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads nothing, answers nothing

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    config = AuthConfig(
        jwks_url=f"http://127.0.0.1:{port}/jwks.json",
        issuer=ISSUER,
        audience=AUDIENCE,
        jwks_timeout_s=0.2,
    )
    cache = JwksCache(config)
    try:
        with pytest.raises(AuthUnavailableError) as info:
            await cache.key_for("rs-1", "RS256")
        assert info.value.http_status == 503 and cache.fetches == 1
    finally:
        await cache.close()
        for writer in held:
            writer.close()
        silent.close()
        await silent.wait_closed()


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"algorithms": ["RS256", "HS256"]}, "'HS256' is refused"),
        ({"algorithms": ["none"]}, "'none' is refused"),
        ({"algorithms": ["PS256"]}, "'PS256' is not one of RS256, ES256, EdDSA"),
        ({"algorithms": []}, "must name at least one"),
        ({"jwks_url": "http://127.0.0.1/j", "jwks_file": "j.json"}, "not both"),
        (
            {"jwks_url": "http://127.0.0.1/j", "audience": "a"},
            "auth.jwks_url (config file): needs auth.issuer",
        ),
        ({"issuer": "i"}, "has no effect without auth.jwks_url"),
        ({"jwks_url": "file:///etc/jwks.json"}, "must be an http:// or https:// URL"),
        ({"hook_url": "127.0.0.1:9000/auth"}, "must be an http:// or https:// URL"),
        ({"hook_timeout_s": 0}, "must be at least 0.1"),
    ],
)
def test_auth_config_refusals(auth: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config({"auth": auth}, {}, {})
    assert message in str(info.value)


def test_jwt_or_hook_is_authentication_enough_off_loopback(tmp_path: Path) -> None:
    jwt_only = {"jwks_url": "https://idp.test/jwks", "issuer": ISSUER, "audience": AUDIENCE}
    for auth in (jwt_only, {"hook_url": "http://127.0.0.1:9/auth"}):
        config = build_config({"server": {"host": "0.0.0.0"}, "auth": auth}, {}, {})
        assert not config.anonymous
    env = {"WHIP_INGEST_AUTH_HOOK_URL": "http://127.0.0.1:9/auth"}
    assert build_config({}, env, {}).auth.hook_url == env["WHIP_INGEST_AUTH_HOOK_URL"]
    with pytest.raises(ConfigError, match="no \\[\\[principals\\]\\], JWKS or auth hook"):
        build_config({"server": {"host": "0.0.0.0"}}, {}, {})
    missing = build_config(
        {"auth": {**jwt_only, "jwks_url": "", "jwks_file": str(tmp_path / "absent.json")}}, {}, {}
    )
    with pytest.raises(ConfigError, match=r"auth\.jwks_file"):
        Authenticator.from_config(missing)
