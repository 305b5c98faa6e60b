"""Server configuration: typed, frozen, validated. Pure apart from reading the TOML file.

Rules:

- Precedence, low to high: defaults < TOML file < environment ``WHIP_INGEST_<SECTION>_<KEY>``
  (``WHIP_INGEST_LIMITS_MAX_SESSIONS=50``) < overrides (CLI flags, keyed
  ``"<section>.<key>"``; a ``None`` value means "flag not given"). A list given at a higher
  level replaces the lower one; lists are never merged.
- Text values (environment, string overrides) are parsed by the field's type: integers,
  finite floats, booleans (``true/false/1/0/yes/no/on/off``), comma-separated lists.
  TOML values must already have the field's type (an int is accepted for a float).
- Unknown sections, keys and ``WHIP_INGEST_*`` variables are errors, except the names in
  :data:`RESERVED_ENV`, which belong to the CLI. ``[[principals]]`` exist only in the file.
- Every error is a :class:`ConfigError` naming the key and where the value came from.
- Refusal to start: no principals and ``server.host`` not loopback (:func:`is_loopback`);
  a budget too small for a single session; a WAL record larger than a segment.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from registry.record import DEFAULT_MAX_RECORD_BYTES
from registry.runs import DEFAULT_DELETED_RETENTION
from registry.snapshot import DEFAULT_TAIL_EVENTS, DEFAULT_WARM_RUNS
from registry.wal import DEFAULT_SEGMENT_BYTES
from whip.eventloop import DEFAULT_EVENT_LOOP, EventLoopKind
from whip.gcpolicy import DEFAULT_YOUNG_THRESHOLD
from whip.sdp import DEFAULT_MAX_BYTES as DEFAULT_SDP_MAX_BYTES

Role = Literal["publisher", "operator"]
ReconnectPolicy = Literal["supersede", "reject"]
DecodeMode = Literal["all", "keyframes"]
CorruptionPolicy = Literal["quarantine", "fail"]

ENV_PREFIX = "WHIP_INGEST_"
RESERVED_ENV = frozenset({"WHIP_INGEST_CONFIG", "WHIP_INGEST_LOG_LEVEL"})
ANONYMOUS = "anonymous"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class ConfigError(ValueError):
    """A configuration that must not be started. ``key`` and ``source`` say where."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None):
        super().__init__(message)
        self.key = key
        self.source = source


class _Invalid(ValueError):
    """A value problem, before it is known which key and source it belongs to."""


_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9-]+)*"
)
_ICE_URL = re.compile(
    r"(?P<scheme>stuns?|turns?):(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
    r"(?::(?P<port>\d{1,5}))?(?:\?transport=(?P<transport>udp|tcp))?"
)
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_PROCESSOR = re.compile(rf"{_DOTTED}:{_DOTTED}")
_PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_BOOLS = {"true": True, "1": True, "yes": True, "on": True}
_BOOLS |= {"false": False, "0": False, "no": False, "off": False}


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (bracketed or IPv4-mapped too)."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.fullmatch(host):
            raise _Invalid(f"must be an IP address or a host name, got {host!r}") from None


def _check_public_hosts(hosts: tuple[str, ...]) -> None:
    for host in hosts:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise _Invalid(f"{host!r} is not an IP address (candidates carry addresses)") from None
    if len(set(map(ipaddress.ip_address, hosts))) != len(hosts):
        raise _Invalid("lists an address twice")


def _check_networks(networks: tuple[str, ...]) -> None:
    for spec in networks:
        try:
            ipaddress.ip_network(spec, strict=False)
        except ValueError:
            raise _Invalid(f"{spec!r} is not an IP address or network") from None


def _check_processors(processors: tuple[str, ...]) -> None:
    for spec in processors:
        if not _PROCESSOR.fullmatch(spec):
            raise _Invalid(f"{spec!r} is not 'package.module:attribute'")


@dataclass(frozen=True, slots=True)
class IceServer:
    """A STUN or TURN URL (RFC 7064/7065); TURN needs ``username`` and ``credential``."""

    url: str
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        match = _ICE_URL.fullmatch(self.url)
        if match is None:
            raise _Invalid(f"{self.url!r} is not a stun:, stuns:, turn: or turns: URL")
        if match["port"] is not None and not 0 < int(match["port"]) <= 65535:
            raise _Invalid(f"{self.url!r} has a bad port")
        if match["scheme"].startswith("stun") and match["transport"] is not None:
            raise _Invalid(f"{self.url!r}: STUN URLs take no ?transport")
        if match["scheme"].startswith("turn") and not (self.username and self.credential):
            raise _Invalid(f"{self.url!r}: TURN needs username and credential (file only)")


class _Rule(NamedTuple):
    """How one key is documented and checked beyond its type."""

    doc: str
    lo: float | None = None
    hi: float | None = None
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = Path("data")
    public_hosts: tuple[str, ...] = ()
    ice_servers: tuple[IceServer, ...] = ()
    reconnect: ReconnectPolicy = "supersede"
    gc_freeze: bool = True
    gc_young_threshold: int = DEFAULT_YOUNG_THRESHOLD
    event_loop: EventLoopKind = DEFAULT_EVENT_LOOP

    RULES: ClassVar[dict[str, _Rule]] = {
        "host": _Rule("address to listen on", check=_check_host),
        "port": _Rule("TCP port to listen on (0: any free port)", 0, 65535),
        "data_dir": _Rule("directory of the WAL and the thumbnails"),
        "public_hosts": _Rule(
            "IP addresses advertised as extra ICE host candidates", check=_check_public_hosts
        ),
        "ice_servers": _Rule("STUN/TURN URLs, or tables {url, username, credential}"),
        "reconnect": _Rule("a push to a live stream: supersede the old session, or reject (409)"),
        "gc_freeze": _Rule(
            "after start-up, exempt what start-up allocated (modules, recovered registry) "
            "from garbage collection (gc.freeze), so a full collection scans only what "
            "came after"
        ),
        "gc_young_threshold": _Rule(
            "net allocations between young-generation garbage collections (gc.set_threshold; "
            "the interpreter's is 700; 0 leaves it)",
            0,
            10_000_000,
        ),
        "event_loop": _Rule(
            "asyncio event loop: uvloop (libuv, the loop's machinery in C) or asyncio "
            "(the standard library's)"
        ),
    }


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_sessions: int = 100
    stream_limit: int = 4
    media_budget_bytes: int = 4 * GiB
    media_budget_threads: int = 256
    stream_ttl_s: float = 60.0
    sdp_max_bytes: int = DEFAULT_SDP_MAX_BYTES
    reclaim_after_s: float = 30.0
    connect_timeout_s: float = 20.0
    tombstone_ttl_s: float = 600.0
    tombstone_capacity: int = 1024
    rate_per_address_per_s: float = 50.0
    burst_per_address: int = 1000
    rate_per_principal_per_s: float = 50.0
    burst_per_principal: int = 1000
    rate_table_capacity: int = 65536
    trusted_proxies: tuple[str, ...] = ()
    max_header_bytes: int = 8 * KiB
    body_timeout_s: float = 10.0
    keepalive_timeout_s: float = 30.0
    sdp_checks_per_turn: int = 8
    negotiation_concurrency: int = 2

    RULES: ClassVar[dict[str, _Rule]] = {
        "max_sessions": _Rule("live sessions, process-wide", 1, 100_000),
        "stream_limit": _Rule("active runs per principal", 1, 10_000),
        "media_budget_bytes": _Rule("queue memory all sessions may reserve", MiB, 1 << 44),
        "media_budget_threads": _Rule("decode threads all sessions may reserve", 1, 4096),
        "stream_ttl_s": _Rule("a live run silent this long reads as expired (0: never)", 0, 1e6),
        "sdp_max_bytes": _Rule("largest SDP offer accepted (413 above)", KiB, MiB),
        "connect_timeout_s": _Rule(
            "a session whose peer has not connected this long after the 201 is reclaimed",
            1,
            600,
        ),
        "reclaim_after_s": _Rule(
            "a peer that sends no media and answers no consent check this long is reclaimed",
            1,
            3600,
        ),
        "tombstone_ttl_s": _Rule("a reclaimed session URL answers DELETE this long", 1, 86400),
        "tombstone_capacity": _Rule("reclaimed-session tombstones kept", 1, 1 << 20),
        "rate_per_address_per_s": _Rule(
            "POST/PATCH/DELETE tokens per second per source address (0: no limit; 429 above)",
            0,
            1e6,
        ),
        "burst_per_address": _Rule("token bucket size per source address", 1, 1 << 30),
        "rate_per_principal_per_s": _Rule(
            "POST/PATCH/DELETE tokens per second per principal (0: no limit; 429 above)",
            0,
            1e6,
        ),
        "burst_per_principal": _Rule("token bucket size per principal", 1, 1 << 30),
        "rate_table_capacity": _Rule(
            "addresses and principals tracked per bucket table (least recently used evicted)",
            16,
            1 << 24,
        ),
        "trusted_proxies": _Rule(
            "peers (addresses or networks) whose X-Forwarded-For names the client",
            check=_check_networks,
        ),
        "max_header_bytes": _Rule(
            "longest request line and header field (aiohttp answers 400 above)", KiB, 64 * KiB
        ),
        "body_timeout_s": _Rule(
            "a POST/PATCH body must arrive this long after its headers (408 otherwise)",
            0.1,
            600,
        ),
        "keepalive_timeout_s": _Rule(
            "an idle connection, or one still sending its headers, is closed after this long",
            1,
            3600,
        ),
        "sdp_checks_per_turn": _Rule(
            "WHIP offers checked per event-loop iteration; the others wait for a later one, "
            "so a burst of POSTs cannot hold the loop",
            1,
            1024,
        ),
        "negotiation_concurrency": _Rule(
            "WHIP negotiations (peer connection, answer) run at once; the others wait, "
            "holding their reservations (one that waits long, e.g. resolving an mDNS "
            "candidate, lets the next one start)",
            1,
            1024,
        ),
    }


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    workers_per_session: int = 2
    queue_depth: int = 16
    payload_limit_bytes: int = 1 * MiB
    thumbnail_interval_s: float = 10.0
    scene_threshold: float = 0.4
    decode: DecodeMode = "all"
    codec_threads: int = 1
    # 4096x2304 admits every 4K picture (3840x2160 UHD, 4096x2160 DCI, their portrait
    # forms) and everything smaller, not 5K and up. Decoder memory per session, measured
    # (H.264, one thread; reference pictures, outside the media permit): 1080p 12 MiB,
    # 1440p 19 MiB, 2160p 40 MiB, 4320p (8K) 149 MiB, about 5 bytes a pixel.
    max_pixels: int = 4096 * 2304
    join_deadline_s: float = 2.0
    drain_s: float = 0.5
    stats_interval_s: float = 5.0
    analyze_audio: bool = True
    processors: tuple[str, ...] = ()

    RULES: ClassVar[dict[str, _Rule]] = {
        "workers_per_session": _Rule("decode worker threads per session", 1, 64),
        "queue_depth": _Rule("encoded frames queued per track", 1, 4096),
        "payload_limit_bytes": _Rule("largest encoded frame a queue accepts", 4 * KiB, 64 * MiB),
        "thumbnail_interval_s": _Rule("seconds between thumbnails (0: none)", 0, 3600),
        "scene_threshold": _Rule("scene-change score threshold", 0, 1),
        "decode": _Rule("decode every frame, or keyframes only"),
        "codec_threads": _Rule("FFmpeg threads per decoder (0: FFmpeg decides)", 0, 64),
        "max_pixels": _Rule(
            "largest video picture decoded, width x height (FFmpeg's max_pixels, with the "
            "width rounded up to a multiple of 64); a bigger one is a decode error, never "
            "allocated (the default, 4096x2304, admits 4K and below)",
            64 * 64,
            16384 * 16384,
        ),
        "join_deadline_s": _Rule(
            "how long a closing session waits for its decode threads before it reports a "
            "forced shutdown and keeps their media permit",
            0.1,
            60,
        ),
        "drain_s": _Rule(
            "on a clean close, how long the decode threads may keep decoding the frames "
            "already queued before the rest are discarded (part of join_deadline_s, at "
            "most half of it)",
            0,
            60,
        ),
        "stats_interval_s": _Rule("seconds between stats events", 0.1, 3600),
        "analyze_audio": _Rule("decode audio tracks (audio_silence events)"),
        "processors": _Rule("extra frame processors, 'module:attribute'", check=_check_processors),
    }

    def drain_budget_s(self) -> float:
        """The drain a clean close grants (``drain_s``, capped at half the join deadline)."""
        return min(self.drain_s, self.join_deadline_s / 2)

    def media_bytes(self, tracks: int) -> int:
        """Queue memory one session with ``tracks`` tracks reserves from the budget."""
        return tracks * self.queue_depth * self.payload_limit_bytes


@dataclass(frozen=True, slots=True)
class WalConfig:
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    on_corruption: CorruptionPolicy = "quarantine"
    queue_capacity: int = 1024
    tail_events: int = DEFAULT_TAIL_EVENTS
    warm_runs: int = DEFAULT_WARM_RUNS
    deleted_retention: int = DEFAULT_DELETED_RETENTION

    RULES: ClassVar[dict[str, _Rule]] = {
        "segment_bytes": _Rule("WAL segment size", 64 * KiB, 1 << 40),
        "max_record_bytes": _Rule("largest WAL record (one event)", KiB, 16 * MiB),
        "on_corruption": _Rule("corrupt log at start: quarantine the rest, or fail"),
        "queue_capacity": _Rule("appends waiting for the writer thread", 1, 1 << 20),
        "tail_events": _Rule("events kept warm per run", 1, 1 << 16),
        "warm_runs": _Rule("runs with a warm tail", 1, 1 << 20),
        "deleted_retention": _Rule("deleted runs remembered for idempotency", 1, 1 << 24),
    }


@dataclass(frozen=True, slots=True)
class PrincipalConfig:
    """One ``[[principals]]`` entry; ``token_sha256`` is normalized to lowercase hex."""

    name: str
    role: Role
    token_sha256: str


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    wal: WalConfig = field(default_factory=WalConfig)
    principals: tuple[PrincipalConfig, ...] = ()

    @property
    def anonymous(self) -> bool:
        """No principals: every request is ``anonymous`` (loopback only)."""
        return not self.principals


_SECTIONS: dict[str, type[Any]] = {
    "server": ServerConfig,
    "limits": LimitsConfig,
    "pipeline": PipelineConfig,
    "wal": WalConfig,
}
_PRINCIPAL_DOCS = {
    "name": "principal name (runs and events carry it)",
    "role": "publisher (own runs) or operator (all runs)",
    "token_sha256": "hex SHA-256 of the bearer token (whip-ingest token)",
}


class _Key(NamedTuple):
    default: object
    type: Any
    rule: _Rule


def _keys(cls: type[Any]) -> dict[str, _Key]:
    """The keys of a section class: default, resolved type and rule, in field order."""
    hints = typing.get_type_hints(cls)
    rules: dict[str, _Rule] = cls.RULES
    return {f.name: _Key(f.default, hints[f.name], rules[f.name]) for f in dataclasses.fields(cls)}


_NAMES: dict[Any, str] = {bool: "a boolean", int: "an integer", float: "a number", Path: "a path"}


def _type_name(value: object) -> str:
    return _NAMES.get(type(value), "a string" if isinstance(value, str) else "a table or list")


def _coerce(value: object, tp: Any, text: bool) -> object:
    """``value`` as type ``tp``; ``text``: strings are parsed (environment, flags)."""
    args = typing.get_args(tp)
    if text and isinstance(value, str):
        value = value.strip()
    if typing.get_origin(tp) is Literal:
        if value not in args:
            raise _Invalid(f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if typing.get_origin(tp) is tuple:
        if text and isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list | tuple):
            raise _Invalid(f"must be a list, got {_type_name(value)}")
        return tuple(_coerce(item, args[0], text) for item in value)
    if tp is IceServer:
        return _ice_server(value)
    if text and isinstance(value, str) and tp is not str:
        return _parse_text(value, tp)
    if tp is Path and isinstance(value, str | Path) and str(value):
        return Path(value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _Invalid(f"must be a finite number, got {value!r}")
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    raise _Invalid(f"must be {_NAMES.get(tp, 'a string')}, got {_type_name(value)} {value!r}")


def _parse_text(value: str, tp: Any) -> object:
    if tp is bool and value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    if tp is int and re.fullmatch(r"[+-]?\d{1,19}", value):
        return int(value)
    if tp is float and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value):
        return _coerce(float(value), float, False)
    if tp is Path and value:
        return Path(value)
    raise _Invalid(f"must be {_NAMES[tp]}, got {value!r}")


def _ice_server(value: object) -> IceServer:
    if isinstance(value, IceServer):
        return value
    if isinstance(value, str):
        return IceServer(value)
    if isinstance(value, dict):
        unknown = set(value) - {"url", "username", "credential"}
        if unknown or not all(isinstance(v, str) for v in value.values()):
            raise _Invalid("an ICE server table has string keys url, username, credential")
        if "url" not in value:
            raise _Invalid("an ICE server table needs a url")
        return IceServer(value["url"], value.get("username"), value.get("credential"))
    raise _Invalid(f"an ICE server is a URL or a table, got {_type_name(value)}")


class _Layers:
    """Validated values per section and key, with the source each came from."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, object]] = {name: {} for name in _SECTIONS}
        self.sources: dict[str, str] = {}

    def set(self, section: str, key: str, raw: object, source: str, text: bool) -> None:
        if section not in _SECTIONS:
            known = ", ".join(_SECTIONS)
            raise ConfigError(
                f"{source}: unknown section {section!r} (known: {known})",
                key=section,
                source=source,
            )
        keys = _keys(_SECTIONS[section])
        dotted = f"{section}.{key}"
        if key not in keys:
            known = ", ".join(keys)
            raise ConfigError(
                f"{source}: unknown key {dotted!r} (known: {known})", key=dotted, source=source
            )
        try:
            value = _coerce(raw, keys[key].type, text)
            _check_rule(value, keys[key].rule)
        except _Invalid as exc:
            raise ConfigError(f"{dotted} ({source}): {exc}", key=dotted, source=source) from None
        self.values[section][key] = value
        self.sources[dotted] = source

    def source(self, dotted: str) -> str:
        return self.sources.get(dotted, "default")


def _check_rule(value: object, rule: _Rule) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if rule.lo is not None and value < rule.lo:
            raise _Invalid(f"must be at least {rule.lo:g}, got {value}")
        if rule.hi is not None and value > rule.hi:
            raise _Invalid(f"must be at most {rule.hi:g}, got {value}")
    if rule.check is not None:
        rule.check(value)


def _principals(raw: object, source: str) -> tuple[PrincipalConfig, ...]:
    where = f"{source} [[principals]]"
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise ConfigError(f"{where}: must be an array of tables", key="principals", source=source)
    result: list[PrincipalConfig] = []
    for number, entry in enumerate(raw, start=1):
        problem = None
        if set(entry) != set(_PRINCIPAL_DOCS):
            problem = f"needs exactly the keys {', '.join(_PRINCIPAL_DOCS)}, got {sorted(entry)}"
        elif not isinstance(entry["name"], str) or not _PRINCIPAL_NAME.fullmatch(entry["name"]):
            problem = "name must be 1-64 of A-Z a-z 0-9 . _ - (starting alphanumeric)"
        elif entry["name"] == ANONYMOUS:
            problem = f"the name {ANONYMOUS!r} is reserved for anonymous mode"
        elif entry["role"] not in typing.get_args(Role):
            problem = f"role must be 'publisher' or 'operator', got {entry['role']!r}"
        elif not isinstance(entry["token_sha256"], str) or not _SHA256_HEX.fullmatch(
            entry["token_sha256"]
        ):
            problem = "token_sha256 must be 64 hex digits (the SHA-256 of the token)"
        elif entry["name"] in {p.name for p in result}:
            problem = f"name {entry['name']!r} appears twice"
        elif entry["token_sha256"].lower() in {p.token_sha256 for p in result}:
            problem = "two principals share one token"
        if problem is not None:
            key = f"principals[{number}]"
            raise ConfigError(f"{where} #{number}: {problem}", key=key, source=source)
        result.append(PrincipalConfig(entry["name"], entry["role"], entry["token_sha256"].lower()))
    return tuple(result)


def _check_whole(config: Config, layers: _Layers) -> None:
    def refuse(dotted: str, message: str) -> ConfigError:
        source = layers.source(dotted)
        return ConfigError(f"{dotted} ({source}): {message}", key=dotted, source=source)

    host = config.server.host
    if config.anonymous and not is_loopback(host):
        raise refuse(
            "server.host",
            f"{host!r} is not loopback and no [[principals]] are "
            "configured: refusing to serve without authentication",
        )
    pipeline, limits = config.pipeline, config.limits
    if pipeline.workers_per_session > limits.media_budget_threads:
        raise refuse(
            "limits.media_budget_threads",
            f"{limits.media_budget_threads} is below "
            f"pipeline.workers_per_session ({pipeline.workers_per_session})",
        )
    if pipeline.media_bytes(2) > limits.media_budget_bytes:
        raise refuse(
            "limits.media_budget_bytes",
            f"{limits.media_budget_bytes} cannot hold one "
            f"audio+video session ({pipeline.media_bytes(2)} bytes: 2 x queue_depth "
            "x payload_limit_bytes)",
        )
    if config.wal.max_record_bytes > config.wal.segment_bytes:
        raise refuse("wal.max_record_bytes", "is larger than wal.segment_bytes")


def build_config(
    document: Mapping[str, object],
    env: Mapping[str, str],
    overrides: Mapping[str, object],
    *,
    file_label: str = "config file",
) -> Config:
    """Layer ``document`` (parsed TOML), ``env`` and ``overrides`` (module rules)."""
    layers = _Layers()
    for section, body in document.items():
        if section == "principals":
            continue
        if not isinstance(body, dict):
            raise ConfigError(
                f"{file_label}: [{section}] must be a table", key=section, source=file_label
            )
        for key, raw in body.items():
            layers.set(section, key, raw, file_label, text=False)
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        section, _, key = name.removeprefix(ENV_PREFIX).lower().partition("_")
        source = f"environment {name}"
        if section == "principals":
            raise ConfigError(
                f"{source}: principals are configured in the file only",
                key="principals",
                source=source,
            )
        layers.set(section, key, env[name], source, text=True)
    for dotted, raw in overrides.items():
        if raw is not None:
            section, _, key = dotted.partition(".")
            layers.set(section, key, raw, f"flag {dotted}", text=isinstance(raw, str))
    principals = _principals(document.get("principals", []), file_label)
    sections = {name: cls(**layers.values[name]) for name, cls in _SECTIONS.items()}
    config = Config(**sections, principals=principals)
    _check_whole(config, layers)
    return config


def load_config(
    path: Path | None, env: Mapping[str, str], overrides: Mapping[str, object]
) -> Config:
    """Read the TOML file at ``path`` (None: no file) and :func:`build_config`.

    Blocking (reads one small file): call it before the event loop starts.
    """
    label = f"config file {path}"
    document: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{label}: cannot read: {exc.strerror}", source=label) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{label}: not valid TOML: {exc}", source=label) from exc
    return build_config(document, env, overrides, file_label=label)


class ConfigKey(NamedTuple):
    """One row of the configuration reference."""

    section: str
    key: str
    type: str
    default: str
    description: str

    @property
    def env(self) -> str | None:
        if self.section == "principals":
            return None
        return f"{ENV_PREFIX}{self.section.upper()}_{self.key.upper()}"


def _type_label(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(f'"{arg}"' for arg in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"list of {_type_label(typing.get_args(tp)[0])}"
    names = {int: "integer", float: "float", bool: "boolean", str: "string", Path: "path"}
    return names.get(tp, "ICE server" if tp is IceServer else str(tp))


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def config_reference() -> list[ConfigKey]:
    """Every key: section, key, type, default (as TOML), description."""
    rows: list[ConfigKey] = []
    for section, cls in _SECTIONS.items():
        for name, key in _keys(cls).items():
            row = ConfigKey(section, name, _type_label(key.type), _toml(key.default), key.rule.doc)
            rows.append(row)
    hints = typing.get_type_hints(PrincipalConfig)
    for name, doc in _PRINCIPAL_DOCS.items():
        rows.append(ConfigKey("principals", name, _type_label(hints[name]), "(required)", doc))
    return rows


def render_reference() -> str:
    """The reference as a Markdown table (for the README)."""
    lines = ["| key | type | default | environment | description |", "|---|---|---|---|---|"]
    for row in config_reference():
        prefix = "[[principals]] " if row.section == "principals" else f"{row.section}."
        name = prefix + row.key
        env = f"`{row.env}`" if row.env else "-"
        cells = (f"`{name}`", row.type, f"`{row.default}`", env, row.description)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
