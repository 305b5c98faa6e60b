"""whip.auth: static bearer tokens, constant-time lookup, roles, anonymous mode.

JWT and the auth hook, through the real server: tests/test_auth_jwt.py,
tests/test_auth_hook.py."""

from __future__ import annotations

import asyncio
import hmac
import string
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from whip.auth import (
    ANONYMOUS,
    MAX_TOKEN_LENGTH,
    Authenticator,
    ForbiddenError,
    Principal,
    Role,
    UnauthorizedError,
    generate_token,
    hash_token,
    parse_bearer,
    require_role,
)
from whip.config import Config, PrincipalConfig, build_config
from whip.errors import HttpError

STUDIO, OPS, OTHER = "studio-token-1", "ops-token-2", "other.token~3"
PRINCIPALS = (
    PrincipalConfig("studio-a", "publisher", hash_token(STUDIO)),
    PrincipalConfig("ops", "operator", hash_token(OPS)),
    PrincipalConfig("studio-b", "publisher", hash_token(OTHER)),
)
CHALLENGE = 'Bearer realm="whip-ingest"'
INVALID = 'Bearer realm="whip-ingest", error="invalid_token"'


@pytest.fixture
def authenticator() -> Authenticator:
    return Authenticator.from_config(Config(principals=PRINCIPALS))


def test_hash_token_is_hex_sha256() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_generated_tokens() -> None:
    first, second = generate_token(), generate_token()
    assert first.token != second.token
    assert first.sha256 == hash_token(first.token)
    assert set(first.token) <= set(string.ascii_letters + string.digits + "-_")
    assert len(first.token) >= 43
    assert parse_bearer(f"Bearer {first.token}") == first.token


async def test_generated_toml_entry_authenticates() -> None:
    generated = generate_token()
    document = tomllib.loads(generated.toml("studio-z", "operator"))
    assert generated.token not in generated.toml("studio-z")
    config = build_config(document, {}, {"server.host": "0.0.0.0"})
    who = await Authenticator.from_config(config).resolve(f"Bearer {generated.token}")
    assert who == Principal("studio-z", Role.OPERATOR)
    with pytest.raises(ValueError):
        generated.toml("x", "admin")


async def test_resolves_each_principal(authenticator: Authenticator) -> None:
    assert not authenticator.anonymous
    results = [await authenticator.resolve(f"Bearer {t}") for t in (STUDIO, OPS, OTHER)]
    assert results == [
        Principal("studio-a", Role.PUBLISHER),
        Principal("ops", Role.OPERATOR),
        Principal("studio-b", Role.PUBLISHER),
    ]
    assert [p.is_operator for p in results] == [False, True, False]


@pytest.mark.parametrize(
    "header",
    [f"bearer {STUDIO}", f"BEARER {STUDIO}", f"  Bearer   {STUDIO}  ", f"Bearer {STUDIO}\t"],
)
async def test_scheme_is_case_insensitive_and_spacing_tolerated(
    authenticator: Authenticator, header: str
) -> None:
    assert (await authenticator.resolve(header)).name == "studio-a"


async def test_from_principal_entries() -> None:
    assert (await Authenticator.from_config(PRINCIPALS).resolve(f"Bearer {OPS}")).name == "ops"


@pytest.mark.parametrize("header", [None, "", "   "])
async def test_missing_credentials(authenticator: Authenticator, header: str | None) -> None:
    with pytest.raises(UnauthorizedError) as info:
        await authenticator.resolve(header)
    error = info.value
    assert (error.http_status, error.code) == (401, "unauthorized")
    assert error.headers == {"WWW-Authenticate": CHALLENGE}
    assert isinstance(error, HttpError)


@pytest.mark.parametrize(
    "header",
    [
        f"Basic {STUDIO}",
        "Bearer",
        "Bearer ",
        f"Bearer {STUDIO} extra",
        f"Bearer{STUDIO}",
        "Bearer tok\u00e9n",
        "Bearer tok,en",
        "Bearer =abc",
        "Bearer " + "a" * (MAX_TOKEN_LENGTH + 1),
        f"Token {STUDIO}",
    ],
)
async def test_malformed_credentials(authenticator: Authenticator, header: str) -> None:
    with pytest.raises(UnauthorizedError) as info:
        await authenticator.resolve(header)
    assert info.value.http_status == 401 and "malformed" in info.value.message
    assert info.value.headers == {"WWW-Authenticate": INVALID}


@pytest.mark.parametrize("token", ["nope", STUDIO + "x", STUDIO.upper(), "a" * MAX_TOKEN_LENGTH])
async def test_unknown_token(authenticator: Authenticator, token: str) -> None:
    with pytest.raises(UnauthorizedError) as info:
        await authenticator.resolve(f"Bearer {token}")
    assert info.value.http_status == 401 and info.value.message == "unknown bearer token"
    assert info.value.headers == {"WWW-Authenticate": INVALID}


@pytest.mark.parametrize("token", [STUDIO, OPS, OTHER, "unknown"])
async def test_compares_against_every_entry(
    authenticator: Authenticator, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)  # what whip.auth calls
    try:
        await authenticator.resolve(f"Bearer {token}")
    except UnauthorizedError:
        assert token == "unknown"
    assert len(calls) == len(PRINCIPALS)
    assert [len(a) for a, _ in calls] == [32] * len(PRINCIPALS)
    assert len({b for _, b in calls}) == len(PRINCIPALS)


async def test_anonymous_mode() -> None:
    authenticator = Authenticator.from_config(Config())
    assert authenticator.anonymous
    for header in (None, "", "Bearer whatever", "garbage"):
        assert await authenticator.resolve(header) is ANONYMOUS
    assert Principal("anonymous", Role.OPERATOR) == ANONYMOUS
    assert ANONYMOUS.is_operator
    assert await authenticator.resolve_requiring(None, Role.OPERATOR) is ANONYMOUS


async def test_roles(authenticator: Authenticator) -> None:
    publisher = Principal("studio-a", Role.PUBLISHER)
    operator = Principal("ops", Role.OPERATOR)
    history = []
    for who in (publisher, operator):
        for role in (Role.PUBLISHER, Role.OPERATOR):
            try:
                require_role(who, role)
                history.append((who.name, str(role), "ok"))
            except ForbiddenError as exc:
                assert (exc.http_status, exc.code) == (403, "forbidden")
                history.append((who.name, str(role), "forbidden"))
    assert history == [
        ("studio-a", "publisher", "ok"),
        ("studio-a", "operator", "forbidden"),
        ("ops", "publisher", "ok"),
        ("ops", "operator", "ok"),
    ]
    assert (await authenticator.resolve_requiring(f"Bearer {OPS}", Role.OPERATOR)).name == "ops"
    with pytest.raises(ForbiddenError, match="studio-a is a publisher; this needs operator"):
        await authenticator.resolve_requiring(f"Bearer {STUDIO}", Role.OPERATOR)
    with pytest.raises(UnauthorizedError):
        await authenticator.resolve_requiring("Bearer unknown", Role.PUBLISHER)


def test_entries_must_be_sha256_digests() -> None:
    with pytest.raises(ValueError):
        Authenticator([("abcd", Principal("x", Role.PUBLISHER))])
    with pytest.raises(ValueError):
        Authenticator([("zz" * 32, Principal("x", Role.PUBLISHER))])


@given(
    st.one_of(st.none(), st.text(max_size=200), st.text(max_size=50).map(lambda t: "Bearer " + t))
)
def test_any_header_resolves_or_is_401(header: str | None) -> None:
    authenticator = Authenticator.from_config(PRINCIPALS)
    try:
        who = asyncio.run(authenticator.resolve(header))
    except UnauthorizedError as exc:
        assert exc.http_status == 401 and "WWW-Authenticate" in exc.headers
    else:
        assert who.name in {p.name for p in PRINCIPALS}
