"""Timeline events: the draft a producer hands in and the durable event a reader gets.

A :class:`NewEvent` has no sequence number; the WAL writer thread assigns one when the
event's batch is written. A :class:`Event` is what was made durable. Both are frozen;
``data`` is a JSON object that nobody mutates after construction (snapshots share it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from registry.errors import InvalidEventError

JsonObject = dict[str, Any]

_TYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class EventType(StrEnum):
    """Event types the system itself writes. Analyzer plug-ins may add their own."""

    RUN_CREATED = "run_created"
    SESSION_CONNECTED = "session_connected"
    FIRST_FRAME = "first_frame"
    STATS = "stats"
    SCENE_CHANGE = "scene_change"
    AUDIO_SILENCE = "audio_silence"
    VIDEO_BLACK = "video_black"
    KEEPALIVE = "keepalive"
    STOP_REQUESTED = "stop_requested"
    SESSION_CLOSED = "session_closed"
    WORKER_FAULT = "worker_fault"
    FORCED_SHUTDOWN = "forced_shutdown"
    RUN_INTERRUPTED = "run_interrupted"
    RUN_DELETED = "run_deleted"


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (event timestamps)."""
    return time.time_ns() // 1_000_000


_VALIDATED_CAP = 4096
_validated: dict[re.Pattern[str], set[str]] = {_TYPE_RE: set(), _ID_RE: set()}
"""Values already checked against each pattern (bounded: producers repeat them)."""


def _check(value: str, pattern: re.Pattern[str]) -> bool:
    seen = _validated[pattern]
    if value in seen:
        return True
    if not isinstance(value, str) or not pattern.fullmatch(value):
        return False
    if len(seen) >= _VALIDATED_CAP:
        seen.clear()
    seen.add(value)
    return True


def is_valid_run_id(run_id: str) -> bool:
    """Run ids are 1-128 chars of ``[A-Za-z0-9_.:-]``, starting alphanumeric."""
    return _check(run_id, _ID_RE)


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event before it is durable: no seq yet."""

    run_id: str
    type: str
    principal: str
    data: JsonObject = field(default_factory=dict)
    ts_ms: int = field(default_factory=now_ms)

    def __post_init__(self) -> None:
        if not is_valid_run_id(self.run_id):
            raise InvalidEventError(f"invalid run id {self.run_id!r}")
        if not _check(self.type, _TYPE_RE):
            raise InvalidEventError(f"invalid event type {self.type!r}")
        if len(self.principal.encode()) > 256:
            raise InvalidEventError("principal longer than 256 bytes")
        if not isinstance(self.data, dict):
            raise InvalidEventError("event data must be a JSON object")


@dataclass(frozen=True, slots=True)
class Event:
    """A durable timeline event; ``seq`` is global, gap-free and strictly increasing."""

    seq: int
    run_id: str
    type: str
    ts_ms: int
    principal: str
    data: JsonObject

    def to_json(self) -> JsonObject:
        """The wire shape of ARCHITECTURE.md."""
        return {
            "seq": self.seq,
            "run_id": self.run_id,
            "type": self.type,
            "ts_ms": self.ts_ms,
            "principal": self.principal,
            "data": self.data,
        }
