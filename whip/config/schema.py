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
- The ``[[principals]]`` and ``[[webhooks]]`` entries and the refusals that involve more
  than one key are checked in :mod:`whip.config.checks`.
- Pure: nothing here reads a file or the environment (:mod:`whip.config.load` reads the
  file; the caller passes the environment in).
- One concept, though past 500 lines: one frozen dataclass per section with a rule per
  key, so its length is the number of keys (the checks that span keys moved out).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from registry.record import DEFAULT_MAX_RECORD_BYTES
from registry.runs import DEFAULT_DELETED_RETENTION
from registry.snapshot import DEFAULT_TAIL_EVENTS, DEFAULT_WARM_RUNS
from registry.wal import DEFAULT_SEGMENT_BYTES
from whip.config.auth import AuthConfig, auth_enabled
from whip.config.errors import InvalidValue
from whip.config.rule import Rule
from whip.config.values import (
    IceServer,
    check_host,
    check_networks,
    check_processors,
    check_public_hosts,
    check_video_codecs,
)
from whip.eventloop import DEFAULT_EVENT_LOOP, EventLoopKind
from whip.gcpolicy import DEFAULT_YOUNG_THRESHOLD
from whip.sdp import DEFAULT_MAX_BYTES as DEFAULT_SDP_MAX_BYTES
from whip.sdp import DEFAULT_VIDEO_CODECS, VideoCodecName
from whip.webhooks.config import WebhookConfig

Role = Literal["publisher", "operator"]
ReconnectPolicy = Literal["supersede", "reject"]
DecodeMode = Literal["all", "keyframes"]
SimulcastMode = Literal["highest", "lowest", "all"]
CorruptionPolicy = Literal["quarantine", "fail"]
RecordingFormat = Literal["fmp4", "mkv"]

ANONYMOUS = "anonymous"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


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
    # A ceiling by default: without one, libwebrtc holds each resolution to its own
    # per-resolution maximum (1.7 Mb/s at 640x360) and a detailed camera picture never
    # leaves 640x360 (docs/INTEROP.md, section 7).
    max_bitrate_bps: int = 10_000_000
    start_bitrate_bps: int = 1_000_000
    transport_cc: bool = True
    video_codecs: tuple[VideoCodecName, ...] = DEFAULT_VIDEO_CODECS
    simulcast: SimulcastMode = "highest"

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
        "max_bitrate_bps": Rule(
            "video bitrate ceiling announced to publishers (b=AS/b=TIAS in the answer, and "
            "REMB; 0: none, and libwebrtc publishers then keep to their own per-resolution "
            "maximum); see docs/INTEROP.md for which publishers honour it",
            0,
            10_000_000_000,
        ),
        "start_bitrate_bps": Rule(
            "where a libwebrtc publisher (Chromium: its offer has transport-cc on video) "
            "starts its bandwidth estimate (x-google-start-bitrate in the answer; 0: its "
            "own 300 kb/s)",
            0,
            100_000_000,
        ),
        "transport_cc": Rule(
            "answer transport-wide congestion control feedback to publishers that offer it "
            "(false: REMB for every publisher)"
        ),
        "video_codecs": Rule(
            "video formats accepted, most preferred first: the answer lists the offer's "
            "receivable ones in this order (a format left out is refused)",
            check=check_video_codecs,
        ),
        "simulcast": Rule(
            "which simulcast layers are decoded: the highest, the lowest, or all "
            "(every offered layer is accepted and measured either way)"
        ),
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
class IceConfig:
    """``[ice]``: the UDP and TCP ports every session's ICE, DTLS and SRTP use
    (:mod:`whip.rtc.udp_mux`, :mod:`whip.rtc.session_sockets`, :mod:`whip.rtc.ice_tcp`)."""

    udp_port: int = 8189
    udp_mux: bool = True
    port_min: int = 0
    port_max: int = 0
    tcp_port: int = 8189
    tcp_handshake_timeout_s: float = 5.0
    tcp_max_connections: int = 1024
    tcp_max_connections_per_address: int = 16
    tcp_max_frame_bytes: int = 1500

    RULES: ClassVar[dict[str, Rule]] = {
        "udp_port": Rule(
            "the one UDP port every session shares when udp_mux is on (0: a free port "
            "chosen at start)",
            0,
            65535,
        ),
        "udp_mux": Rule(
            "share one UDP socket among all sessions; false: one socket per session, "
            "within port_min..port_max"
        ),
        "port_min": Rule(
            "lowest UDP port of a per-session socket (udp_mux false; 0 with port_max 0: any)",
            0,
            65535,
        ),
        "port_max": Rule(
            "highest UDP port of a per-session socket (udp_mux false; 0 with port_min 0: any)",
            0,
            65535,
        ),
        "tcp_port": Rule(
            "the one TCP port of ICE-TCP passive candidates (0: a free port chosen at "
            "start; -1: no ICE-TCP)",
            -1,
            65535,
        ),
        "tcp_handshake_timeout_s": Rule(
            "an ICE-TCP connection with no verified binding request by then is closed", 0.1, 300
        ),
        "tcp_max_connections": Rule("ICE-TCP connections open at once, all sessions", 1, 65536),
        "tcp_max_connections_per_address": Rule(
            "ICE-TCP connections open at once from one remote IP address", 1, 65536
        ),
        "tcp_max_frame_bytes": Rule(
            "longest RFC 4571 frame an ICE-TCP connection may send (else it is closed)", 548, 65535
        ),
    }


def check_store_url(value: str) -> None:
    """``""`` (the embedded WAL) or a ``postgresql://`` / ``postgres://`` URL."""
    if value and not value.startswith(("postgresql://", "postgres://")):
        raise InvalidValue("must be a postgresql:// URL (or empty: the embedded WAL)")


def check_advertise_url(value: str) -> None:
    if value and not value.startswith(("http://", "https://")):
        raise InvalidValue("must be an http:// or https:// base URL")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: cluster mode on PostgreSQL (``store`` empty: the embedded WAL)."""

    store: str = ""
    node_id: str = ""
    advertise_url: str = ""
    lease_s: float = 10.0
    secret: str = ""

    RULES: ClassVar[dict[str, Rule]] = {
        "store": Rule(
            "PostgreSQL URL of the cluster store (empty: the embedded WAL, one node)",
            check=check_store_url,
        ),
        "node_id": Rule("this node's id in the cluster (empty: host name and port)"),
        "advertise_url": Rule(
            "this node's base URL in Location and links (empty: from server.host and port)",
            check=check_advertise_url,
        ),
        "lease_s": Rule("node lease; renewed every lease_s/6, lost after lease_s", 0.5, 3600),
        "secret": Rule(
            "shared secret of node-to-node requests (required with a store; never logged)"
        ),
    }

    @property
    def enabled(self) -> bool:
        return bool(self.store)


@dataclass(frozen=True, slots=True)
class RecordingConfig:
    """``[recording]``: remux of every pushed stream into segment files
    (:mod:`pipeline.recording`); a principal's ``record`` overrides ``enabled``."""

    enabled: bool = False
    segment_s: float = 60.0
    format: RecordingFormat = "fmp4"
    max_bytes: int = 0
    dir: str = ""

    RULES: ClassVar[dict[str, Rule]] = {
        "enabled": Rule("record every push (stream copy, never re-encoded)"),
        "segment_s": Rule(
            "seconds of media per segment file; a segment starts at a video keyframe", 1, 86400
        ),
        "format": Rule("segment container: fragmented MP4 (.mp4) or Matroska (.mkv)"),
        "max_bytes": Rule(
            "disk budget of all recordings: past it the oldest ended runs' recordings are "
            "deleted (0: no budget)",
            0,
            1 << 60,
        ),
        "dir": Rule("directory of the recordings (empty: <data_dir>/recordings)"),
    }

    def directory(self, data_dir: Path) -> Path:
        """Where the recordings are kept: ``dir``, or ``<data_dir>/recordings``."""
        return Path(self.dir) if self.dir else data_dir / "recordings"


@dataclass(frozen=True, slots=True)
class PrincipalConfig:
    """One ``[[principals]]`` entry; ``token_sha256`` is normalized to lowercase hex.
    ``record``: None follows ``recording.enabled``."""

    name: str
    role: Role
    token_sha256: str
    record: bool | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration: one instance of each section, and the principals."""

    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    wal: WalConfig = field(default_factory=WalConfig)
    ice: IceConfig = field(default_factory=IceConfig)
    recording: RecordingConfig = field(default_factory=RecordingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    principals: tuple[PrincipalConfig, ...] = ()
    webhooks: tuple[WebhookConfig, ...] = ()

    @property
    def anonymous(self) -> bool:
        """No principals, no JWT, no hook: every request is ``anonymous`` (loopback only)."""
        return not self.principals and not auth_enabled(self.auth)

    def records(self, principal: str) -> bool:
        """Whether ``principal``'s pushes are recorded: its ``record``, else
        ``recording.enabled``."""
        for entry in self.principals:
            if entry.name == principal and entry.record is not None:
                return entry.record
        return self.recording.enabled


SECTIONS: dict[str, type[Any]] = {  # in the reference's order
    "server": ServerConfig,
    "limits": LimitsConfig,
    "pipeline": PipelineConfig,
    "wal": WalConfig,
    "ice": IceConfig,
    "recording": RecordingConfig,
    "auth": AuthConfig,
    "cluster": ClusterConfig,
}
PRINCIPAL_DOCS = {
    "name": "principal name (runs and events carry it)",
    "role": "publisher (own runs) or operator (all runs)",
    "token_sha256": "hex SHA-256 of the bearer token (whip-ingest token)",
}
PRINCIPAL_OPTIONAL_DOCS = {
    "record": "record this principal's pushes, whatever recording.enabled says",
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
