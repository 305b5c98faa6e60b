"""whip.config through its public surface: defaults, layering (file < environment < flags),
validation, reference."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.timeline import TimelineConfig
from whip.config import (
    RESERVED_ENV,
    Config,
    ConfigError,
    IceServer,
    LimitsConfig,
    PrincipalConfig,
    ServerConfig,
    build_config,
    config_reference,
    is_loopback,
    load_config,
    render_reference,
)

HASH_A = "a" * 64
HASH_B = "0123456789abcdef" * 4

FULL = f"""
[server]
host = "0.0.0.0"
port = 9000
data_dir = "/var/lib/whip"
public_hosts = ["203.0.113.10", "2001:db8::10"]
ice_servers = [
  "stun:stun.example.org:3478",
  {{ url = "turn:turn.example.org?transport=udp", username = "u", credential = "p" }},
]
reconnect = "reject"

[limits]
max_sessions = 20
stream_limit = 2
media_budget_bytes = 1_073_741_824
media_budget_threads = 40
stream_ttl_s = 30
sdp_max_bytes = 16384
reclaim_after_s = 12.5

[pipeline]
workers_per_session = 3
queue_depth = 8
decode = "keyframes"
analyze_audio = false
processors = ["plugins.logo:LogoDetector"]

[wal]
on_corruption = "fail"
segment_bytes = 1048576

[[principals]]
name = "studio-a"
role = "publisher"
token_sha256 = "{HASH_A.upper()}"

[[principals]]
name = "ops"
role = "operator"
token_sha256 = "{HASH_B}"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "whip.toml"
    path.write_text(text)
    return path


def fails(
    document: dict[str, object] | None = None,
    env: dict[str, str] | None = None,
    flags: dict[str, object] | None = None,
) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build_config(document or {}, env or {}, flags or {})
    return info.value


# --- defaults -----------------------------------------------------------------------------


def test_defaults() -> None:
    config = load_config(None, {}, {})
    assert config == Config()
    assert (config.server.host, config.server.port, config.server.data_dir) == (
        "127.0.0.1",
        8080,
        Path("./data"),
    )
    assert (config.limits.max_sessions, config.limits.stream_limit) == (100, 4)
    assert config.limits.sdp_max_bytes == 32 * 1024
    assert config.server.reconnect == "supersede"
    assert (config.pipeline.decode, config.wal.on_corruption) == ("all", "quarantine")
    assert config.anonymous and config.principals == ()


def test_wal_defaults_are_the_registry_defaults() -> None:
    wal = Config().wal
    timeline = TimelineConfig(Path("x"))
    for name in ("segment_bytes", "max_record_bytes", "queue_capacity", "tail_events",
                 "warm_runs", "deleted_retention", "on_corruption"):  # fmt: skip
        assert getattr(wal, name) == getattr(timeline, name), name


def test_default_budgets_admit_max_sessions_of_audio_and_video() -> None:
    config = Config()
    per_session = config.pipeline.media_bytes(2)
    assert per_session == 2 * 16 * 1024 * 1024
    assert config.limits.media_budget_bytes // per_session >= config.limits.max_sessions
    threads = config.limits.media_budget_threads // config.pipeline.workers_per_session
    assert threads >= config.limits.max_sessions


def test_config_is_frozen() -> None:
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.port = 1  # type: ignore[misc]


# --- the file -----------------------------------------------------------------------------


def test_full_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL), {}, {})
    assert config.server == ServerConfig(
        host="0.0.0.0",
        port=9000,
        data_dir=Path("/var/lib/whip"),
        public_hosts=("203.0.113.10", "2001:db8::10"),
        ice_servers=(
            IceServer("stun:stun.example.org:3478"),
            IceServer("turn:turn.example.org?transport=udp", "u", "p"),
        ),
        reconnect="reject",
    )
    assert config.limits == LimitsConfig(
        max_sessions=20,
        stream_limit=2,
        media_budget_bytes=1 << 30,
        media_budget_threads=40,
        stream_ttl_s=30.0,
        sdp_max_bytes=16384,
        reclaim_after_s=12.5,
    )
    assert isinstance(config.limits.stream_ttl_s, float)
    assert (config.pipeline.workers_per_session, config.pipeline.queue_depth) == (3, 8)
    assert config.pipeline.decode == "keyframes" and config.pipeline.analyze_audio is False
    assert config.pipeline.processors == ("plugins.logo:LogoDetector",)
    assert (config.wal.on_corruption, config.wal.segment_bytes) == ("fail", 1 << 20)
    assert config.principals == (
        PrincipalConfig("studio-a", "publisher", HASH_A),  # normalized to lowercase
        PrincipalConfig("ops", "operator", HASH_B),
    )
    assert not config.anonymous


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[server]\nport = 'x'\n", "server.port (config file"),
        ("[servre]\nport = 1\n", "unknown section 'servre'"),
        ("[server]\nprot = 1\n", "unknown key 'server.prot'"),
        ("server = 3\n", "[server] must be a table"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_file_errors_name_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, {})
    assert fragment in str(info.value)
    assert info.value.source == f"config file {path}"


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml", {}, {})
    path = tmp_path / "binary.toml"
    path.write_bytes(b"[server]\nhost = '\xff'\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, {}, {})


@pytest.mark.parametrize(
    ("section", "key", "value", "fragment"),
    [
        ("server", "port", "8080", "must be an integer, got a string '8080'"),
        ("server", "port", 8080.0, "must be an integer, got a number"),
        ("server", "port", True, "must be an integer, got a boolean"),
        ("server", "port", 70000, "must be at most 65535, got 70000"),
        ("server", "port", -1, "must be at least 0"),
        ("server", "host", ["a"], "must be a string"),
        ("server", "host", "bad host!", "must be an IP address or a host name"),
        ("server", "host", "[::1]", "must be an IP address or a host name"),
        ("server", "data_dir", "", "must be a path"),
        ("server", "public_hosts", "1.2.3.4", "must be a list"),
        ("server", "public_hosts", ["example.com"], "is not an IP address"),
        ("server", "public_hosts", ["1.2.3.4", "1.2.3.4"], "lists an address twice"),
        ("server", "public_hosts", ["::1", "0::1"], "lists an address twice"),
        ("server", "public_hosts", [1], "must be a string"),
        ("server", "reconnect", "replace", "must be one of 'supersede', 'reject'"),
        ("server", "ice_servers", ["http://x"], "is not a stun:, stuns:, turn: or turns: URL"),
        ("server", "ice_servers", ["stun:x?transport=udp"], "STUN URLs take no ?transport"),
        ("server", "ice_servers", ["stun:x:0"], "has a bad port"),
        ("server", "ice_servers", ["turn:x"], "TURN needs username and credential"),
        ("server", "ice_servers", [{"url": "turn:x", "username": "u"}], "TURN needs"),
        ("server", "ice_servers", [{"urls": "stun:x"}], "string keys url, username, credential"),
        ("server", "ice_servers", [{"username": "u"}], "needs a url"),
        ("server", "ice_servers", [3], "an ICE server is a URL or a table"),
        ("limits", "max_sessions", 0, "must be at least 1, got 0"),
        ("limits", "stream_ttl_s", -1, "must be at least 0"),
        ("limits", "stream_ttl_s", float("nan"), "must be a finite number"),
        ("limits", "stream_ttl_s", "60", "must be a number"),
        ("limits", "sdp_max_bytes", 100, "must be at least 1024"),
        ("pipeline", "scene_threshold", 1.5, "must be at most 1"),
        ("pipeline", "decode", "some", "must be one of 'all', 'keyframes'"),
        ("pipeline", "analyze_audio", 1, "must be a boolean"),
        ("pipeline", "processors", ["no_colon"], "is not 'package.module:attribute'"),
        ("pipeline", "processors", ["a.b:c:d"], "is not 'package.module:attribute'"),
        ("pipeline", "video_codecs", [], "must name at least one video codec"),
        ("pipeline", "video_codecs", ["vp9", "h264", "vp9"], "lists vp9 more than once"),
        ("pipeline", "video_codecs", ["hevc"], "must be one of 'h264', 'h265', 'av1', 'vp9'"),
        ("pipeline", "video_codecs", "h264", "must be a list"),
        ("wal", "on_corruption", "ignore", "must be one of 'quarantine', 'fail'"),
        ("wal", "max_record_bytes", 10, "must be at least 1024"),
    ],
)
def test_file_value_errors(section: str, key: str, value: object, fragment: str) -> None:
    error = fails({section: {key: value}})
    assert fragment in str(error)
    assert error.key == f"{section}.{key}" and error.source == "config file"
    assert str(error).startswith(f"{section}.{key} (config file): ")


def test_good_ice_servers() -> None:
    servers = [
        "stun:[2001:db8::1]:3478",
        "stuns:stun.example.org",
        {"url": "turns:turn.example.org:5349?transport=tcp", "username": "u", "credential": "c"},
    ]
    config = build_config({"server": {"ice_servers": servers}}, {}, {})
    assert [s.url for s in config.server.ice_servers] == [
        "stun:[2001:db8::1]:3478",
        "stuns:stun.example.org",
        "turns:turn.example.org:5349?transport=tcp",
    ]


# --- principals ---------------------------------------------------------------------------


def principal(**fields: object) -> dict[str, object]:
    return {"name": "studio-a", "role": "publisher", "token_sha256": HASH_A} | fields


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ("x", "must be an array of tables"),
        (["x"], "must be an array of tables"),
        ([{"name": "a", "role": "publisher"}], "#1: needs exactly the keys"),
        ([principal(extra=1)], "#1: needs exactly the keys"),
        ([principal(role="admin")], "role must be 'publisher' or 'operator'"),
        ([principal(token_sha256="abc")], "token_sha256 must be 64 hex digits"),
        ([principal(token_sha256="g" * 64)], "token_sha256 must be 64 hex digits"),
        ([principal(token_sha256=5)], "token_sha256 must be 64 hex digits"),
        ([principal(name="")], "name must be"),
        ([principal(name="has space")], "name must be"),
        ([principal(name=3)], "name must be"),
        ([principal(name="anonymous")], "reserved for anonymous mode"),
        ([principal(), principal(token_sha256=HASH_B)], "#2: name 'studio-a' appears twice"),
        ([principal(), principal(name="b", token_sha256=HASH_A.upper())], "share one token"),
    ],
)
def test_principal_errors(entries: object, fragment: str) -> None:
    error = fails({"principals": entries})
    assert fragment in str(error)
    assert str(error).startswith("config file [[principals]]")


def test_principals_only_in_the_file() -> None:
    error = fails(env={"WHIP_INGEST_PRINCIPALS_NAME": "x"})
    assert "file only" in str(error) and error.source == "environment WHIP_INGEST_PRINCIPALS_NAME"


# --- environment and flags ----------------------------------------------------------------


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nmax_sessions = 10\nstream_limit = 3\n[server]\nport = 1\n")
    env = {"WHIP_INGEST_LIMITS_MAX_SESSIONS": "20", "WHIP_INGEST_SERVER_PORT": "2"}
    config = load_config(path, env, {"server.port": 3})
    assert (config.limits.stream_limit, config.limits.max_sessions, config.server.port) == (
        3,
        20,
        3,
    )
    config = load_config(path, env, {"server.port": None})  # a flag not given
    assert config.server.port == 2


def test_lists_are_replaced_not_merged() -> None:
    config = build_config(
        {"server": {"public_hosts": ["192.0.2.1", "192.0.2.2"]}},
        {"WHIP_INGEST_SERVER_PUBLIC_HOSTS": "192.0.2.3"},
        {},
    )
    assert config.server.public_hosts == ("192.0.2.3",)
    config = build_config({}, {"WHIP_INGEST_SERVER_PUBLIC_HOSTS": ""}, {})
    assert config.server.public_hosts == ()


def test_environment_parsing_by_type() -> None:
    env = {
        "WHIP_INGEST_SERVER_PORT": " 9001 ",
        "WHIP_INGEST_SERVER_DATA_DIR": "/tmp/whip",
        "WHIP_INGEST_SERVER_PUBLIC_HOSTS": "127.0.0.1, 2001:db8::1 ,",
        "WHIP_INGEST_SERVER_ICE_SERVERS": "stun:a.example,stun:b.example:3478",
        "WHIP_INGEST_SERVER_RECONNECT": "reject",
        "WHIP_INGEST_LIMITS_STREAM_TTL_S": "2.5",
        "WHIP_INGEST_LIMITS_RECLAIM_AFTER_S": "1e1",
        "WHIP_INGEST_LIMITS_MEDIA_BUDGET_BYTES": "+2147483648",
        "WHIP_INGEST_PIPELINE_ANALYZE_AUDIO": "Off",
        "WHIP_INGEST_PIPELINE_PROCESSORS": "a.b:C,d:e.f",
        "WHIP_INGEST_CONFIG": "/etc/whip.toml",  # reserved for the CLI
        "PATH": "/usr/bin",  # not ours
    }
    config = build_config({}, env, {})
    assert config.server.port == 9001
    assert config.server.data_dir == Path("/tmp/whip")
    assert config.server.public_hosts == ("127.0.0.1", "2001:db8::1")
    assert config.server.ice_servers == (
        IceServer("stun:a.example"),
        IceServer("stun:b.example:3478"),
    )
    assert config.server.reconnect == "reject"
    assert (config.limits.stream_ttl_s, config.limits.reclaim_after_s) == (2.5, 10.0)
    assert config.limits.media_budget_bytes == 1 << 31
    assert config.pipeline.analyze_audio is False
    assert config.pipeline.processors == ("a.b:C", "d:e.f")
    assert "WHIP_INGEST_CONFIG" in RESERVED_ENV


@pytest.mark.parametrize("text", ["true", "1", "yes", "on", "TRUE"])
def test_environment_booleans(text: str) -> None:
    env = {"WHIP_INGEST_PIPELINE_ANALYZE_AUDIO": text}
    assert build_config({"pipeline": {"analyze_audio": False}}, env, {}).pipeline.analyze_audio


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("WHIP_INGEST_SERVER_PORT", "80x", "must be an integer, got '80x'"),
        ("WHIP_INGEST_SERVER_PORT", "", "must be an integer"),
        ("WHIP_INGEST_SERVER_PORT", "9" * 30, "must be an integer"),
        ("WHIP_INGEST_SERVER_PORT", "99999", "must be at most 65535"),
        ("WHIP_INGEST_LIMITS_STREAM_TTL_S", "nan", "must be a number"),
        ("WHIP_INGEST_LIMITS_STREAM_TTL_S", "1e999", "must be a finite number"),
        ("WHIP_INGEST_PIPELINE_ANALYZE_AUDIO", "maybe", "must be a boolean"),
        ("WHIP_INGEST_SERVER_RECONNECT", "later", "must be one of"),
        ("WHIP_INGEST_SERVER_ICE_SERVERS", "turn:t.example", "TURN needs username and credential"),
        ("WHIP_INGEST_SERVER_PROT", "1", "unknown key 'server.prot'"),
        ("WHIP_INGEST_SERVERS_PORT", "1", "unknown section 'servers'"),
        ("WHIP_INGEST_LOGLEVEL", "1", "unknown section 'loglevel'"),
    ],
)
def test_environment_errors_name_the_variable(name: str, value: str, fragment: str) -> None:
    error = fails(env={name: value})
    assert fragment in str(error)
    assert error.source == f"environment {name}"


def test_flags_take_typed_values_or_text() -> None:
    flags: dict[str, object] = {
        "server.port": 0,
        "server.data_dir": Path("d"),
        "server.public_hosts": ["127.0.0.1"],
        "limits.max_sessions": "7",
        "limits.stream_limit": None,
    }
    config = build_config({}, {}, flags)
    assert (config.server.port, config.server.data_dir) == (0, Path("d"))
    assert (config.server.public_hosts, config.limits.max_sessions) == (("127.0.0.1",), 7)
    assert config.limits.stream_limit == 4


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({"server.port": "eighty"}, "server.port (flag server.port): must be an integer"),
        ({"limits.max_sessions": 0}, "limits.max_sessions (flag limits.max_sessions): must be at"),
        ({"port": 1}, "flag port: unknown section 'port'"),
        ({"server.bogus": 1}, "flag server.bogus: unknown key 'server.bogus'"),
    ],
)
def test_flag_errors(flags: dict[str, object], fragment: str) -> None:
    assert fragment in str(fails(flags=flags))


def test_video_codecs_from_each_layer() -> None:
    assert build_config({}, {}, {}).pipeline.video_codecs == ("h264", "h265", "av1", "vp9", "vp8")
    env = {"WHIP_INGEST_PIPELINE_VIDEO_CODECS": "av1,h264"}
    assert build_config({}, env, {}).pipeline.video_codecs == ("av1", "h264")
    flags = {"pipeline.video_codecs": ("vp9",)}
    assert build_config({}, env, flags).pipeline.video_codecs == ("vp9",)


# --- whole-config checks ------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.org"])
def test_refuses_unauthenticated_non_loopback(host: str) -> None:
    error = fails(flags={"server.host": host})
    assert "not loopback and no [[principals]]" in str(error)
    assert (error.key, error.source) == ("server.host", "flag server.host")
    config = build_config({"principals": [principal()]}, {}, {"server.host": host})
    assert config.server.host == host and not config.anonymous


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LocalHost"])
def test_anonymous_on_loopback_is_allowed(host: str) -> None:
    assert build_config({}, {}, {"server.host": host}).anonymous


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        (" localhost. ", True),
        ("0.0.0.0", False),
        ("::", False),
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("localhost.example.org", False),
        ("::ffff:10.0.0.1", False),
        ("", False),
        ("not an address", False),
    ],
)
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_budget_must_hold_one_session() -> None:
    error = fails({"limits": {"media_budget_threads": 1}, "pipeline": {"workers_per_session": 2}})
    assert error.key == "limits.media_budget_threads" and error.source == "config file"
    assert "below pipeline.workers_per_session (2)" in str(error)
    error = fails(
        {"pipeline": {"queue_depth": 4096, "payload_limit_bytes": 1 << 26}},
        env={"WHIP_INGEST_LIMITS_MEDIA_BUDGET_BYTES": str(1 << 30)},
    )
    assert error.key == "limits.media_budget_bytes"
    assert "(environment WHIP_INGEST_LIMITS_MEDIA_BUDGET_BYTES)" in str(error)
    assert "cannot hold one audio+video session" in str(error)


def test_record_must_fit_a_segment() -> None:
    error = fails({"wal": {"segment_bytes": 65536, "max_record_bytes": 1 << 20}})
    assert error.key == "wal.max_record_bytes"


# --- reference ----------------------------------------------------------------------------


def test_reference_lists_every_key_in_order() -> None:
    rows = config_reference()
    config = Config()
    for section in ("server", "limits", "pipeline", "wal"):
        names = [f.name for f in dataclasses.fields(getattr(config, section))]
        assert [r.key for r in rows if r.section == section] == names
    principal_keys = [r.key for r in rows if r.section == "principals"]
    assert principal_keys == ["name", "role", "token_sha256", "record"]
    assert all(r.description for r in rows)
    by_key = {(r.section, r.key): r for r in rows}
    assert by_key["server", "reconnect"].type == '"supersede" | "reject"'
    assert by_key["server", "public_hosts"].type == "list of string"
    assert by_key["limits", "max_sessions"].env == "WHIP_INGEST_LIMITS_MAX_SESSIONS"
    assert by_key["principals", "name"].env is None


def test_reference_defaults_are_toml_that_loads_to_the_defaults() -> None:
    text = ""
    for section in ("server", "limits", "pipeline", "wal"):
        text += f"[{section}]\n"
        text += "".join(
            f"{r.key} = {r.default}\n" for r in config_reference() if r.section == section
        )
    assert build_config(tomllib.loads(text), {}, {}) == Config()


def test_rendered_reference() -> None:
    table = render_reference()
    lines = table.splitlines()
    assert lines[0] == "| key | type | default | environment | description |"
    assert len(lines) == 2 + len(config_reference())
    assert '| `server.reconnect` | "supersede" \\| "reject" | `"supersede"` |' in table
    assert "| `[[principals]] role` |" in table


# --- properties ---------------------------------------------------------------------------

ENV_NAMES = [r.env for r in config_reference() if r.env is not None]


@given(st.dictionaries(st.sampled_from(ENV_NAMES), st.text(max_size=30), max_size=4))
def test_any_environment_gives_a_config_or_a_config_error(env: dict[str, str]) -> None:
    try:
        config = build_config({}, env, {})
    except ConfigError as exc:
        assert exc.source is not None and exc.source.startswith("environment WHIP_INGEST_")
    else:
        assert isinstance(config, Config)


TOML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@given(
    st.sampled_from(
        [
            (r.section, r.key)
            for r in config_reference()
            if r.section not in ("principals", "webhooks")
        ]
    ),
    TOML_VALUES,
)
def test_any_file_value_gives_a_config_or_a_config_error(
    where: tuple[str, str], value: object
) -> None:
    section, key = where
    try:
        build_config({section: {key: value}}, {}, {})
    except ConfigError as exc:
        # the key itself, or a whole-config check it tripped (e.g. a huge queue_depth)
        whole = {"limits.media_budget_bytes", "limits.media_budget_threads", "wal.max_record_bytes"}
        assert exc.key == f"{section}.{key}" or exc.key in whole
