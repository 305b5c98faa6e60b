"""What a valid configuration is: its sections, keys, types, defaults and limits.

Rules:

- A section is a frozen dataclass; each field is a key, its annotation the key's type,
  its default the default. ``RULES`` gives every key a description (the reference's),
  optional inclusive bounds ``lo``/``hi`` for numbers, and an optional value check
  (:mod:`whip.config.values`). Adding a key is adding a field and its rule: the layering,
  its environment variable and the generated reference follow from them (the README's
  copy of the reference is checked by ``tests/test_readme.py``).
- Types a key may have: ``int``, ``float``, ``bool``, ``str``, ``Path``, a ``Literal`` of
  strings, :class:`IceServer`, or a ``tuple[...]`` of one of those (a list in TOML).
- ``[[principals]]`` entries need exactly ``name``, ``role`` and ``token_sha256``: a name of
  1-64 of ``A-Z a-z 0-9 . _ -`` starting alphanumeric, not ``anonymous`` (that one is
  anonymous mode's), unique; a role ``publisher`` or ``operator``; 64 hex digits, stored
  lowercase, no two principals with one token.
- Whole-config refusals (:func:`check_whole`): no principals while ``server.host`` is not
  loopback; fewer budget threads than one session's workers; a budget that cannot hold one
  audio+video session's queues; a WAL record larger than a segment.
- Pure: nothing here reads a file or the environment (:mod:`whip.config.load` reads the
  file; the caller passes the environment in).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from registry.record import DEFAULT_MAX_RECORD_BYTES
from registry.runs import DEFAULT_DELETED_RETENTION
from registry.snapshot import DEFAULT_TAIL_EVENTS, DEFAULT_WARM_RUNS
from registry.wal import DEFAULT_SEGMENT_BYTES
from whip.config.errors import ConfigError, InvalidValue
from whip.config.values import (
    IceServer,
    check_host,
    check_networks,
    check_processors,
    check_public_hosts,
    is_loopback,
)
from whip.eventloop import DEFAULT_EVENT_LOOP, EventLoopKind
from whip.gcpolicy import DEFAULT_YOUNG_THRESHOLD
from whip.names import PRINCIPAL_RULE, is_principal_name
from whip.sdp import DEFAULT_MAX_BYTES as DEFAULT_SDP_MAX_BYTES

Role = Literal["publisher", "operator"]
ReconnectPolicy = Literal["supersede", "reject"]
DecodeMode = Literal["all", "keyframes"]
CorruptionPolicy = Literal["quarantine", "fail"]

ANONYMOUS = "anonymous"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


class Rule(NamedTuple):
    """How one key is documented and checked beyond its type."""

    doc: str
    lo: float | None = None
    hi: float | None = None
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``[server]``: where the server listens, what it advertises, its process-wide choices."""

    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = Path("data")
    public_hosts: tuple[str, ...] = ()
    ice_servers: tuple[IceServer, ...] = ()
    reconnect: ReconnectPolicy = "supersede"
    gc_freeze: bool = True
    gc_young_threshold: int = DEFAULT_YOUNG_THRESHOLD
    event_loop: EventLoopKind = DEFAULT_EVENT_LOOP

    RULES: ClassVar[dict[str, Rule]] = {
        "host": Rule("address to listen on", check=check_host),
        "port": Rule("TCP port to listen on (0: any free port)", 0, 65535),
        "data_dir": Rule("directory of the WAL and the thumbnails"),
        "public_hosts": Rule(
            "IP addresses advertised as extra ICE host candidates", check=check_public_hosts
        ),
        "ice_servers": Rule("STUN/TURN URLs, or tables {url, username, credential}"),
        "reconnect": Rule("a push to a live stream: supersede the old session, or reject (409)"),
        "gc_freeze": Rule(
            "after start-up, exempt what start-up allocated (modules, recovered registry) "
            "from garbage collection (gc.freeze), so a full collection scans only what "
            "came after"
        ),
        "gc_young_threshold": Rule(
            "net allocations between young-generation garbage collections (gc.set_threshold; "
            "the interpreter's is 700; 0 leaves it)",
            0,
            10_000_000,
        ),
        "event_loop": Rule(
            "asyncio event loop: uvloop (libuv, the loop's machinery in C) or asyncio "
            "(the standard library's)"
        ),
    }


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """``[limits]``: caps on sessions, runs, budgets, request sizes, rates and timeouts."""

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

    RULES: ClassVar[dict[str, Rule]] = {
        "max_sessions": Rule("live sessions, process-wide", 1, 100_000),
        "stream_limit": Rule("active runs per principal", 1, 10_000),
        "media_budget_bytes": Rule("queue memory all sessions may reserve", MiB, 1 << 44),
        "media_budget_threads": Rule("decode threads all sessions may reserve", 1, 4096),
        "stream_ttl_s": Rule("a live run silent this long reads as expired (0: never)", 0, 1e6),
        "sdp_max_bytes": Rule("largest SDP offer accepted (413 above)", KiB, MiB),
        "connect_timeout_s": Rule(
            "a session whose peer has not connected this long after the 201 is reclaimed",
            1,
            600,
        ),
        "reclaim_after_s": Rule(
            "a peer that sends no media and answers no consent check this long is reclaimed",
            1,
            3600,
        ),
        "tombstone_ttl_s": Rule("a reclaimed session URL answers DELETE this long", 1, 86400),
        "tombstone_capacity": Rule("reclaimed-session tombstones kept", 1, 1 << 20),
        "rate_per_address_per_s": Rule(
            "POST/PATCH/DELETE tokens per second per source address (0: no limit; 429 above)",
            0,
            1e6,
        ),
        "burst_per_address": Rule("token bucket size per source address", 1, 1 << 30),
        "rate_per_principal_per_s": Rule(
            "POST/PATCH/DELETE tokens per second per principal (0: no limit; 429 above)",
            0,
            1e6,
        ),
        "burst_per_principal": Rule("token bucket size per principal", 1, 1 << 30),
        "rate_table_capacity": Rule(
            "addresses and principals tracked per bucket table (least recently used evicted)",
            16,
            1 << 24,
        ),
        "trusted_proxies": Rule(
            "peers (addresses or networks) whose X-Forwarded-For names the client",
            check=check_networks,
        ),
        "max_header_bytes": Rule(
            "longest request line and header field (aiohttp answers 400 above)", KiB, 64 * KiB
        ),
        "body_timeout_s": Rule(
            "a POST/PATCH body must arrive this long after its headers (408 otherwise)",
            0.1,
            600,
        ),
        "keepalive_timeout_s": Rule(
            "an idle connection, or one still sending its headers, is closed after this long",
            1,
            3600,
        ),
        "sdp_checks_per_turn": Rule(
            "WHIP offers checked per event-loop iteration; the others wait for a later one, "
            "so a burst of POSTs cannot hold the loop",
            1,
            1024,
        ),
        "negotiation_concurrency": Rule(
            "WHIP negotiations (peer connection, answer) run at once; the others wait, "
            "holding their reservations (one that waits long, e.g. resolving an mDNS "
            "candidate, lets the next one start)",
            1,
            1024,
        ),
    }


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """``[pipeline]``: the per-session media pipeline (queues, decode threads, analyzers)."""

    workers_per_session: int = 2
    queue_depth: int = 16
    payload_limit_bytes: int = 1 * MiB
    thumbnail_interval_s: float = 10.0
    scene_threshold: float = 0.4
    decode: DecodeMode = "all"
    codec_threads: int = 1
    # 4096x2304 admits every 4K picture (3840x2160 UHD, 4096x2160 DCI, their portrait
    # forms) and everything smaller, not 5K and up. The bound matters because decoder
    # memory (reference pictures) grows with the picture and sits outside the media
    # permit; the measured figures are in docs/OPERATIONS.md ("Known limits").
    max_pixels: int = 4096 * 2304
    join_deadline_s: float = 2.0
    drain_s: float = 0.5
    stats_interval_s: float = 5.0
    analyze_audio: bool = True
    processors: tuple[str, ...] = ()

    RULES: ClassVar[dict[str, Rule]] = {
        "workers_per_session": Rule("decode worker threads per session", 1, 64),
        "queue_depth": Rule("encoded frames queued per track", 1, 4096),
        "payload_limit_bytes": Rule("largest encoded frame a queue accepts", 4 * KiB, 64 * MiB),
        "thumbnail_interval_s": Rule("seconds between thumbnails (0: none)", 0, 3600),
        "scene_threshold": Rule("scene-change score threshold", 0, 1),
        "decode": Rule("decode every frame, or keyframes only"),
        "codec_threads": Rule("FFmpeg threads per decoder (0: FFmpeg decides)", 0, 64),
        "max_pixels": Rule(
            "largest video picture decoded, width x height (FFmpeg's max_pixels, with the "
            "width rounded up to a multiple of 64); a bigger one is a decode error, never "
            "allocated (the default, 4096x2304, admits 4K and below)",
            64 * 64,
            16384 * 16384,
        ),
        "join_deadline_s": Rule(
            "how long a closing session waits for its decode threads before it reports a "
            "forced shutdown and keeps their media permit",
            0.1,
            60,
        ),
        "drain_s": Rule(
            "on a clean close, how long the decode threads may keep decoding the frames "
            "already queued before the rest are discarded (part of join_deadline_s, at "
            "most half of it)",
            0,
            60,
        ),
        "stats_interval_s": Rule("seconds between stats events", 0.1, 3600),
        "analyze_audio": Rule("decode audio tracks (audio_silence events)"),
        "processors": Rule("extra frame processors, 'module:attribute'", check=check_processors),
    }

    def drain_budget_s(self) -> float:
        """The drain a clean close grants (``drain_s``, capped at half the join deadline)."""
        return min(self.drain_s, self.join_deadline_s / 2)

    def media_bytes(self, tracks: int) -> int:
        """Queue memory one session with ``tracks`` tracks reserves from the budget."""
        return tracks * self.queue_depth * self.payload_limit_bytes


@dataclass(frozen=True, slots=True)
class WalConfig:
    """``[wal]``: the write-ahead log, its writer queue and the warm tails."""

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    on_corruption: CorruptionPolicy = "quarantine"
    queue_capacity: int = 1024
    tail_events: int = DEFAULT_TAIL_EVENTS
    warm_runs: int = DEFAULT_WARM_RUNS
    deleted_retention: int = DEFAULT_DELETED_RETENTION

    RULES: ClassVar[dict[str, Rule]] = {
        "segment_bytes": Rule("WAL segment size", 64 * KiB, 1 << 40),
        "max_record_bytes": Rule("largest WAL record (one event)", KiB, 16 * MiB),
        "on_corruption": Rule("corrupt log at start: quarantine the rest, or fail"),
        "queue_capacity": Rule("appends waiting for the writer thread", 1, 1 << 20),
        "tail_events": Rule("events kept warm per run", 1, 1 << 16),
        "warm_runs": Rule("runs with a warm tail", 1, 1 << 20),
        "deleted_retention": Rule("deleted runs remembered for idempotency", 1, 1 << 24),
    }


@dataclass(frozen=True, slots=True)
class PrincipalConfig:
    """One ``[[principals]]`` entry; ``token_sha256`` is normalized to lowercase hex."""

    name: str
    role: Role
    token_sha256: str


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration: one instance of each section, and the principals."""

    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    wal: WalConfig = field(default_factory=WalConfig)
    principals: tuple[PrincipalConfig, ...] = ()

    @property
    def anonymous(self) -> bool:
        """No principals: every request is ``anonymous`` (loopback only)."""
        return not self.principals


SECTIONS: dict[str, type[Any]] = {  # in the reference's order
    "server": ServerConfig,
    "limits": LimitsConfig,
    "pipeline": PipelineConfig,
    "wal": WalConfig,
}
PRINCIPAL_DOCS = {
    "name": "principal name (runs and events carry it)",
    "role": "publisher (own runs) or operator (all runs)",
    "token_sha256": "hex SHA-256 of the bearer token (whip-ingest token)",
}


class Key(NamedTuple):
    """One key of a section: its default, its resolved type and its rule."""

    default: object
    type: Any
    rule: Rule


def section_keys(cls: type[Any]) -> dict[str, Key]:
    """The keys of a section class: default, resolved type and rule, in field order."""
    hints = typing.get_type_hints(cls)
    rules: dict[str, Rule] = cls.RULES
    return {f.name: Key(f.default, hints[f.name], rules[f.name]) for f in dataclasses.fields(cls)}


def check_rule(value: object, rule: Rule) -> None:
    """``value`` (already of the key's type) within the rule's bounds and check."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if rule.lo is not None and value < rule.lo:
            raise InvalidValue(f"must be at least {rule.lo:g}, got {value}")
        if rule.hi is not None and value > rule.hi:
            raise InvalidValue(f"must be at most {rule.hi:g}, got {value}")
    if rule.check is not None:
        rule.check(value)


def parse_principals(raw: object, source: str) -> tuple[PrincipalConfig, ...]:
    """The ``[[principals]]`` array of ``source`` (the file's label), checked entry by
    entry; the first problem is a :class:`ConfigError` naming the entry's number."""
    where = f"{source} [[principals]]"
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise ConfigError(f"{where}: must be an array of tables", key="principals", source=source)
    result: list[PrincipalConfig] = []
    for number, entry in enumerate(raw, start=1):
        problem = None
        if set(entry) != set(PRINCIPAL_DOCS):
            problem = f"needs exactly the keys {', '.join(PRINCIPAL_DOCS)}, got {sorted(entry)}"
        elif not isinstance(entry["name"], str) or not is_principal_name(entry["name"]):
            problem = f"name must be {PRINCIPAL_RULE}"
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


def check_whole(config: Config, source_of: Callable[[str], str]) -> None:
    """The refusals that involve more than one key; ``source_of("section.key")`` names
    where the blamed key's value came from (``"default"`` when nowhere)."""

    def refuse(dotted: str, message: str) -> ConfigError:
        source = source_of(dotted)
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
