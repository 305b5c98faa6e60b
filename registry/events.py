"""Timeline events: the draft a producer hands in and the durable event a reader gets.

A :class:`NewEvent` has no sequence number; the WAL writer thread assigns one when the
event's batch is written. A :class:`Event` is what was made durable. Both are immutable;
``data`` is a JSON object that nobody mutates after construction (snapshots share it).

Both are tuples (``NamedTuple``), not the frozen slots dataclasses STYLE.md asks for on
hot paths: every append builds one of each, on the one core the GIL gives producers and
WAL writer together, and a tuple costs a fraction of a dataclass to build (the writer
builds ``Event`` through ``tuple.__new__``, cheaper still; figures in
docs/PERFORMANCE.md). Both stay immutable (attribute assignment raises, as on a frozen
dataclass); the price is tuple behaviour: indexing, unpacking, and equality with a plain
tuple of the same fields.
"""

from __future__ import annotations

import re
import time
from enum import StrEnum
from typing import Any, NamedTuple

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
    ICE_RESTARTED = "ice_restarted"
    STREAM_WARNING = "stream_warning"
    STREAM_CHANGED = "stream_changed"
    SIMULCAST_LAYER = "simulcast_layer"
    RECORDING_SEGMENT = "recording_segment"
    RECORDING_FAILED = "recording_failed"


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (event timestamps)."""
    return time.time_ns() // 1_000_000


_VALIDATED_CAP = 4096
_valid_ids: set[str] = set()
"""Run ids already checked (bounded: producers repeat them)."""
_valid_types: dict[str, str] = {}
"""Event types already checked, each mapped to itself as a plain ``str``."""


def _check(value: str, pattern: re.Pattern[str], seen: set[str]) -> bool:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        return False
    if len(seen) >= _VALIDATED_CAP:
        seen.clear()
    seen.add(value)
    return True


def _checked_type(value: str) -> str | None:
    """``value`` as a plain ``str`` if it is a valid event type, else None."""
    if not isinstance(value, str) or not _TYPE_RE.fullmatch(value):
        return None
    plain = str.__str__(value)
    if len(_valid_types) >= _VALIDATED_CAP:
        _valid_types.clear()
    _valid_types[plain] = plain
    return plain


def is_valid_run_id(run_id: str) -> bool:
    """Run ids are 1-128 chars of ``[A-Za-z0-9_.:-]``, starting alphanumeric."""
    return run_id in _valid_ids or _check(run_id, _ID_RE, _valid_ids)


class _NewEventFields(NamedTuple):
    run_id: str
    type: str
    principal: str
    data: JsonObject
    ts_ms: int


class NewEvent(_NewEventFields):
    """An event before it is durable: no seq yet.

    ``NewEvent(run_id, type, principal, data={}, ts_ms=now)``; raises
    :class:`InvalidEventError` for a bad run id, type, principal or non-dict ``data``.

    The ``__new__`` below is the reference; where ``registry._newevent`` is built, a C
    ``__new__`` replaces it and calls it for every call off its fast path (see the end
    of this module).
    """

    __slots__ = ()

    def __new__(
        cls,
        run_id: str,
        type: str,
        principal: str,
        data: JsonObject | None = None,
        ts_ms: int | None = None,
    ) -> NewEvent:
        # The set lookups are the hot path: producers repeat their run ids and types.
        if run_id not in _valid_ids and not _check(run_id, _ID_RE, _valid_ids):
            raise InvalidEventError(f"invalid run id {run_id!r}")
        # Stored as a plain str, never an EventType member: what a cold read decodes,
        # so warm and cold reads hand out the very same values.
        plain_type = _valid_types.get(type) or _checked_type(type)
        if plain_type is None:
            raise InvalidEventError(f"invalid event type {type!r}")
        # <= 64 characters are <= 256 UTF-8 bytes: encode only longer ones.
        if principal.__class__ is not str or len(principal) > 64:
            if not isinstance(principal, str):
                raise InvalidEventError("principal must be a string")
            if len(principal.encode()) > 256:
                raise InvalidEventError("principal longer than 256 bytes")
        if data is None:
            data = {}
        elif data.__class__ is not dict and not isinstance(data, dict):
            raise InvalidEventError("event data must be a JSON object")
        if ts_ms is None:
            ts_ms = time.time_ns() // 1_000_000
        return tuple.__new__(cls, (run_id, plain_type, principal, data, ts_ms))


_py_new = NewEvent.__new__
"""The pure-Python ``NewEvent.__new__``: the reference, and the C constructor's slow path
(kept as the class's function, so its errors still name ``NewEvent.__new__()``)."""

# The constructor in C, ``registry._newevent`` (a required part of the build; see
# pyproject.toml): the same instances and errors (tests/test_newevent_fast.py compares
# them) at a fraction of the cost (docs/PERFORMANCE.md). Its fast path reads _valid_ids
# and _valid_types by reference: clear them, never rebind them.
try:
    from registry._newevent import configure as _c_configure
    from registry._newevent import new_event as _c_new_event
except ImportError:  # pragma: no cover - the bench's --without-c: the pure Python above
    HAVE_C_NEW_EVENT = False
else:
    HAVE_C_NEW_EVENT = True
    _c_configure(_py_new, _valid_ids, _valid_types, NewEvent)
    NewEvent.__new__ = staticmethod(_c_new_event)  # type: ignore[method-assign]


class Event(NamedTuple):
    """A durable timeline event; ``seq`` is gap-free and strictly increasing: across the
    whole log on the embedded WAL, within its run in cluster mode (:mod:`registry.pg`)."""

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
