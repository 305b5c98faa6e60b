"""WAL record codec and segment scanner. Pure: no files, no threads (sans-IO).

The encoding functions here are the reference; their glue around orjson and crc32c also
runs in C (``registry/_framing.c``, bound at the end of the encoding section), with these
as its slow path.

Frame layout (little endian)::

    u32 length | u32 crc32c(payload) | payload[length]

Payload layout::

    u64 seq | i64 ts_ms | u16 len(run_id) | u16 len(type) | u16 len(principal)
    | run_id | type | principal | data (UTF-8 JSON object)

Rules the scanner enforces:

- A frame is *valid* when its length fits, its CRC matches and its seq is exactly the
  next expected one.
- The first invalid frame ends the intact prefix. If everything from there to the end of
  the segment is zero bytes, it is space the writer preallocated and never wrote (in any
  segment: no frame can hide in zeros, and the next segment's first seq still has to
  follow on): a **torn tail**, reported with ``zero_tail`` set. Otherwise, in the last
  segment, if no valid frame can be found anywhere after that point, the rest is a torn
  tail (a write the crash interrupted) and may be truncated. Otherwise, or in any
  earlier segment, it is **corruption**: records after it exist but cannot be trusted in
  order, so it is reported, never silently skipped.

Rules of the JSON ``data`` (:func:`encode_json`):

- Any JSON text that decodes to the event's object is a valid record: the format fixes
  the value, not the spelling. Records are decoded with the standard library's
  ``json.loads``, which reads every record ever written: those of earlier versions
  (``json.dumps`` with ``separators=(",", ":")``: ASCII escapes, Python's float repr)
  and those written now. ``orjson.loads`` is not used: it reads integers beyond 64
  bits as floats.
- orjson writes the text: compact, keys in insertion order, text as UTF-8 (not
  ``\\uXXXX`` escapes), floats as the shortest text that reads back as the same float
  (``1e-7`` where Python writes ``1e-07``, ``0.00001`` for ``1e-05``).
- The set of storable values stays what the standard library accepts (with
  ``allow_nan=False``): what orjson refuses but the standard library writes (integers
  beyond 64 bits, non-``str`` or ``str``-subclass keys, lone surrogates, nesting deeper
  than orjson's 254 levels) is written by the standard library; datetimes and
  dataclasses, which orjson would convert, are handed to the standard library, which
  refuses them; NaN and infinities, which orjson writes as ``null``, are refused. What
  neither takes raises the standard library's error. Two kinds of value orjson writes
  that the standard library refused are stored as orjson writes them: ``uuid.UUID`` (a
  string) and plain ``enum.Enum`` members (their value).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import crc32c
import orjson

from registry.errors import EventTooLargeError, InvalidEventError
from registry.events import Event, NewEvent

FRAME_HEADER = struct.Struct("<II")
SEQ = struct.Struct("<Q")
BODY_HEADER = struct.Struct("<qHHH")
PAYLOAD_HEADER = struct.Struct("<QqHHH")
MIN_PAYLOAD = PAYLOAD_HEADER.size
DEFAULT_MAX_RECORD_BYTES = 64 * 1024

SEQ_SIZE = SEQ.size
FRAME_START = struct.Struct("<IIQ")
"""A frame's header and the seq that starts its payload."""
FRAME_OVERHEAD = FRAME_START.size
"""Bytes a frame adds to its body (length, CRC, seq)."""
_pack_body_header = BODY_HEADER.pack


_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""Datetimes and dataclasses go to the fallback (which refuses them), not to ISO text and
dicts: an event's data reads back as what was appended, or is refused."""
_orjson_dumps = orjson.dumps
_stdlib_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False)


def _has_non_finite(value: object) -> bool:
    """Whether a NaN or an infinity is anywhere in ``value`` (dicts, lists, tuples)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False


def encode_json(data: object) -> bytes:
    """``data`` as compact UTF-8 JSON text (the JSON rules of the module docstring).

    Raises ``TypeError``, ``ValueError`` or ``RecursionError`` (the standard library's
    errors) where ``data`` is not JSON.
    """
    try:
        text = _orjson_dumps(data, None, _ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        pass
    else:
        # find(), not ``in``: bytes.__contains__ first tries its argument as an int and
        # pays for the TypeError, several times the cost of the search itself.
        if text.find(b"null") < 0 or not _has_non_finite(data):
            return text
    # Outside the except block: the standard library's error carries no orjson context.
    return _stdlib_encoder.encode(data).encode()


def _py_encode_body(event: NewEvent, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> bytes:
    """Encode everything of the payload but the seq (which only the writer knows).

    Raises :class:`EventTooLargeError` when the whole frame would exceed
    ``max_record_bytes``, :class:`InvalidEventError` when ``data`` is not JSON.
    """
    run_id, etype, principal, data, ts_ms = event
    raw_run = run_id.encode()
    raw_type = etype.encode()
    raw_principal = principal.encode()
    try:
        raw_data = encode_json(data)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidEventError(f"event data is not serializable JSON: {exc}") from exc
    body = b"".join(
        (
            _pack_body_header(ts_ms, len(raw_run), len(raw_type), len(raw_principal)),
            raw_run,
            raw_type,
            raw_principal,
            raw_data,
        )
    )
    if FRAME_OVERHEAD + len(body) > max_record_bytes:
        raise EventTooLargeError(
            f"event of type {etype!r} encodes to {FRAME_OVERHEAD + len(body)} bytes; "
            f"the limit is {max_record_bytes}"
        )
    return body


def _py_encode_frames(first_seq: int, bodies: Iterable[bytes]) -> bytes:
    """The frames of ``bodies`` with consecutive seqs from ``first_seq``, concatenated.

    Frame ``i`` is ``FRAME_OVERHEAD + len(bodies[i])`` long. One join for the batch (the
    writer's ``pwrite``) instead of a concatenation per frame.
    """
    parts: list[bytes] = []
    append = parts.append
    pack_seq = SEQ.pack
    pack_frame_start = FRAME_START.pack
    checksum = crc32c.crc32c
    seq = first_seq
    for body in bodies:
        crc = checksum(body, checksum(pack_seq(seq)))
        append(pack_frame_start(len(body) + SEQ_SIZE, crc, seq))
        append(body)
        seq += 1
    return b"".join(parts)


class BodyEncoder(Protocol):
    """:func:`_py_encode_body`'s signature."""

    def __call__(self, event: NewEvent, max_record_bytes: int = ...) -> bytes: ...


class FramesEncoder(Protocol):
    """:func:`_py_encode_frames`'s signature."""

    def __call__(self, first_seq: int, bodies: Iterable[bytes]) -> bytes: ...


# The glue around orjson and crc32c in C, ``registry._framing`` (a required part of the
# build; see pyproject.toml): the same bytes and errors (tests/test_framing.py compares
# them), every call off its fast path handled by the two functions above, which stay the
# reference. Why C at all: in Python this glue costs more per append than orjson and the
# CRC themselves (docs/PERFORMANCE.md).
try:
    from registry._framing import configure as _c_configure
    from registry._framing import encode_body as _c_encode_body
    from registry._framing import encode_frames as _c_encode_frames
except ImportError:  # pragma: no cover - the bench's --without-c: the pure Python above
    HAVE_C_FRAMING = False
else:
    HAVE_C_FRAMING = True
    _c_configure(_py_encode_body, _py_encode_frames, _orjson_dumps, _ORJSON_OPTIONS, crc32c.crc32c)

encode_body: BodyEncoder = _c_encode_body if HAVE_C_FRAMING else _py_encode_body
"""``encode_body(event, max_record_bytes=DEFAULT_MAX_RECORD_BYTES)``: the record body of
``event`` (:func:`_py_encode_body`, its glue in C when ``registry._framing`` is built)."""
encode_frames: FramesEncoder = _c_encode_frames if HAVE_C_FRAMING else _py_encode_frames
"""``encode_frames(first_seq, bodies)``: the frames of ``bodies`` with consecutive seqs from
``first_seq``, concatenated (:func:`_py_encode_frames`, in C when ``registry._framing`` is
built)."""


def encode_frame(seq: int, body: bytes) -> bytes:
    """Prefix ``body`` with its seq and frame it with length and CRC32C."""
    return encode_frames(seq, [body])


def decode_payload(payload: bytes | memoryview) -> Event:
    """Decode one frame payload (without the 8-byte frame header) into an :class:`Event`."""
    seq, ts_ms, lr, lt, lp = PAYLOAD_HEADER.unpack_from(payload, 0)
    pos = PAYLOAD_HEADER.size
    raw = bytes(payload)
    run_id = raw[pos : pos + lr].decode()
    pos += lr
    etype = raw[pos : pos + lt].decode()
    pos += lt
    principal = raw[pos : pos + lp].decode()
    pos += lp
    data = json.loads(raw[pos:])
    return Event(seq, run_id, etype, ts_ms, principal, data)


def decode_frame_at(buf: bytes | memoryview, offset: int) -> Event:
    """Decode the frame starting at ``offset`` (already known valid)."""
    length, _crc = FRAME_HEADER.unpack_from(buf, offset)
    start = offset + FRAME_HEADER.size
    return decode_payload(memoryview(buf)[start : start + length])


class ScanEnd(Enum):
    """How a segment scan ended."""

    CLEAN = "clean"
    TORN_TAIL = "torn_tail"
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """What recovery needs from one record without decoding its JSON data."""

    offset: int
    seq: int
    ts_ms: int
    run_id: str
    type: str
    principal: str


@dataclass(slots=True)
class ScanOutcome:
    """Filled in by :func:`scan_segment` once its iterator is exhausted."""

    end: ScanEnd = ScanEnd.CLEAN
    good_end: int = 0
    """Offset just past the last valid frame: where a torn tail is truncated."""
    next_seq: int = 0
    """The seq the next valid record must carry."""
    reason: str = ""
    zero_tail: bool = False
    """The segment ends in zero bytes after ``good_end``: preallocated, never written."""


def _frame_ok(buf: bytes, offset: int, expect_seq: int, max_record_bytes: int) -> str:
    """Return '' when the frame at ``offset`` is valid, else why it is not."""
    end = len(buf)
    if offset + FRAME_HEADER.size > end:
        return "incomplete frame header"
    length, crc = FRAME_HEADER.unpack_from(buf, offset)
    if length < MIN_PAYLOAD or length + FRAME_HEADER.size > max_record_bytes:
        return f"implausible frame length {length}"
    start = offset + FRAME_HEADER.size
    if start + length > end:
        return "frame extends past end of segment"
    view = memoryview(buf)[start : start + length]
    if crc32c.crc32c(view) != crc:
        return "checksum mismatch"
    (seq,) = SEQ.unpack_from(buf, start)
    if seq != expect_seq:
        return f"sequence {seq} where {expect_seq} was expected"
    return ""


_NONZERO = re.compile(rb"[^\x00]")


def _all_zero_from(buf: bytes, start: int) -> bool:
    return buf.count(0, start) == len(buf) - start


def _valid_frame_after(buf: bytes, start: int, min_seq: int, max_record_bytes: int) -> int:
    """Find any checksum-valid frame with seq >= ``min_seq`` at an offset > ``start``.

    Returns its offset or -1. Costs one header probe per byte of the remainder, and a CRC
    only where the length field is plausible; called only after a bad frame. Runs of
    zero bytes (preallocated space) are skipped in C: a frame's length field is not 0.
    """
    end = len(buf)
    view = memoryview(buf)
    pos = start
    stop = end - FRAME_HEADER.size - MIN_PAYLOAD + 1
    while True:
        pos += 1
        if pos >= stop:
            return -1
        length, crc = FRAME_HEADER.unpack_from(buf, pos)
        if length == 0:
            found = _NONZERO.search(buf, pos)
            if found is None:
                return -1
            pos = max(pos, found.start() - 4)
            continue
        if length < MIN_PAYLOAD or length + FRAME_HEADER.size > max_record_bytes:
            continue
        payload_start = pos + FRAME_HEADER.size
        if payload_start + length > end:
            continue
        if crc32c.crc32c(view[payload_start : payload_start + length]) != crc:
            continue
        (seq,) = SEQ.unpack_from(buf, payload_start)
        if seq >= min_seq:
            return pos


def scan_frames(
    buf: bytes,
    expect_seq: int,
    outcome: ScanOutcome,
    *,
    is_last: bool,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[tuple[int, int, int, int, bytes, bytes]]:
    """Yield ``(offset, frame_length, seq, ts_ms, run_id, type)`` of every valid record.

    The hot loop of recovery: ``run_id`` and ``type`` stay raw UTF-8 bytes (callers
    decode each distinct value once), nothing else is decoded. ``outcome`` is filled in
    when the iterator is exhausted; the first invalid frame is classified per the module
    rules (torn tail vs corruption).
    """
    offset = 0
    end = len(buf)
    view = memoryview(buf)
    checksum = crc32c.crc32c
    frame_header = FRAME_HEADER.unpack_from
    payload_header = PAYLOAD_HEADER.unpack_from
    header_size = FRAME_HEADER.size
    fixed = PAYLOAD_HEADER.size
    while offset < end:
        valid = False
        if offset + header_size <= end:
            length, crc = frame_header(buf, offset)
            start = offset + header_size
            stop = start + length
            if (
                MIN_PAYLOAD <= length <= max_record_bytes - header_size
                and stop <= end
                and checksum(view[start:stop]) == crc
            ):
                seq, ts_ms, lr, lt, _lp = payload_header(buf, start)
                if seq == expect_seq:
                    valid = True
        if not valid:
            outcome.good_end = offset
            outcome.next_seq = expect_seq
            if _all_zero_from(buf, offset):
                outcome.reason = f"unwritten (zero) space from offset {offset}"
                outcome.zero_tail = True
                outcome.end = ScanEnd.TORN_TAIL
                return
            problem = _frame_ok(buf, offset, expect_seq, max_record_bytes)
            outcome.reason = f"{problem} at offset {offset}"
            later = _valid_frame_after(buf, offset, expect_seq, max_record_bytes)
            outcome.end = ScanEnd.TORN_TAIL if is_last and later < 0 else ScanEnd.CORRUPT
            return
        pos = start + fixed
        yield offset, stop - offset, seq, ts_ms, buf[pos : pos + lr], buf[pos + lr : pos + lr + lt]
        expect_seq += 1
        offset = stop
    outcome.end = ScanEnd.CLEAN
    outcome.good_end = offset
    outcome.next_seq = expect_seq


def principal_at(buf: bytes, offset: int) -> str:
    """The principal of the (valid) frame at ``offset``, decoded alone."""
    _seq, _ts, lr, lt, lp = PAYLOAD_HEADER.unpack_from(buf, offset + FRAME_HEADER.size)
    pos = offset + FRAME_HEADER.size + PAYLOAD_HEADER.size + lr + lt
    return buf[pos : pos + lp].decode()


def scan_segment(
    buf: bytes,
    expect_seq: int,
    outcome: ScanOutcome,
    *,
    is_last: bool,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[RecordInfo]:
    """Like :func:`scan_frames`, with every field decoded into a :class:`RecordInfo`."""
    for offset, _length, seq, ts_ms, run_id, etype in scan_frames(
        buf, expect_seq, outcome, is_last=is_last, max_record_bytes=max_record_bytes
    ):
        yield RecordInfo(
            offset, seq, ts_ms, run_id.decode(), etype.decode(), principal_at(buf, offset)
        )
