"""The intermediate form between the per-packet step and the frame step (sans-IO, pure).

Rules:

- A depacketizer's per-packet step turns one RTP payload into *fragment elements*; the
  per-packet outputs of one frame, concatenated in sequence-number order (what aiortc's
  jitter buffer does with ``packet._data``), are a valid element stream, and the frame
  step (:func:`join_units`, then the format's own assembly) turns that stream into the
  decoder's bitstream.
- One element: ``flags`` (1 byte), ``length`` (2 bytes, big-endian), ``length`` bytes of
  body. An RTP payload fits in a UDP datagram (< 65536 bytes), so a body that would not
  fit in 2 bytes is refused (``element_too_large``), never truncated.
- ``CONTINUES``: the body carries on the unit of the element before it (an H.265 FU
  without S, the first AV1 OBU element under Z, a VP9 packet without B).
  ``CONTINUED``: the unit carries on in the next element (FU without E, AV1 Y, VP9 E
  clear). ``KEY``: the payload format itself says a keyframe starts here (AV1 N, VP9 P
  clear on the first packet of a picture). ``DON``: the body starts with a 2-byte H.265
  decoding order number.
- Continuity is checked when the units are joined: a ``CONTINUES`` element must follow a
  ``CONTINUED`` one and the reverse (``fragment_without_start``,
  ``fragment_without_end``); the first element of a frame must not continue anything
  (``frame_start_missing``) and the last must not be continued (``frame_end_missing``).
  That is how a frame whose first or last packet was lost is caught: aiortc's jitter
  buffer only guarantees no gap *between* the first and last packet it saw of one
  timestamp.
- Bounded work: one pass over the elements; the joined size is checked against the
  caller's cap *before* any unit is built (``frame_too_large``), so memory stays within
  the cap plus the input.

Why an intermediate form and not the final bitstream per packet: an AV1 OBU split over
packets needs its ``obu_size`` written before its first byte, which no per-packet output
can know; an H.265 stream with DONL may need its NAL units reordered; and a lost first
or last packet of a frame is invisible once fragments are plain bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pipeline.rtp_payload.errors import PayloadError

CONTINUES = 0x01
CONTINUED = 0x02
KEY = 0x04
DON = 0x08
KNOWN_FLAGS = CONTINUES | CONTINUED | KEY | DON

_HEADER = struct.Struct(">BH")
HEADER_BYTES = _HEADER.size
MAX_BODY = 0xFFFF


def element(flags: int, body: bytes) -> bytes:
    """One element: ``flags``, the body's length, the body."""
    if len(body) > MAX_BODY:
        raise PayloadError("element_too_large", f"{len(body)} bytes in one element")
    return _HEADER.pack(flags, len(body)) + body


@dataclass(frozen=True, slots=True)
class Unit:
    """One whole unit of a frame (an H.265 NAL unit, an AV1 OBU, a VP9 layer frame), its
    fragments joined. ``flags`` are its first element's (``KEY``, ``DON``)."""

    flags: int
    body: bytes


def join_units(data: bytes, max_frame_bytes: int) -> list[Unit]:
    """The units of one frame's element stream, fragments joined, continuity checked.

    Raises :class:`PayloadError` for a malformed stream (``bad_element``), a broken
    fragment chain (see the module rules), an empty frame (``empty_frame``) or a joined
    size over ``max_frame_bytes`` (``frame_too_large``).
    """
    view = memoryview(data)
    n = len(data)
    # Pass 1: walk and check the elements, count the body bytes (no copies yet).
    spans: list[tuple[int, int, int]] = []
    total = 0
    offset = 0
    open_unit = False
    while offset < n:
        if n - offset < HEADER_BYTES:
            raise PayloadError("bad_element", "element header past the end")
        flags, length = _HEADER.unpack_from(data, offset)
        offset += HEADER_BYTES
        if flags & ~KNOWN_FLAGS or length > n - offset:
            raise PayloadError("bad_element", f"flags {flags:#x}, length {length}")
        continues = bool(flags & CONTINUES)
        if continues and not open_unit:
            reason = "fragment_without_start" if spans else "frame_start_missing"
            raise PayloadError(reason, "a fragment continues a unit that never started")
        if open_unit and not continues:
            raise PayloadError("fragment_without_end", "a unit started before the last ended")
        open_unit = bool(flags & CONTINUED)
        total += length
        if total > max_frame_bytes:
            raise PayloadError("frame_too_large", f"over {max_frame_bytes} bytes")
        spans.append((flags, offset, length))
        offset += length
    if open_unit:
        raise PayloadError("frame_end_missing", "the last unit never ended")
    if not spans:
        raise PayloadError("empty_frame", "no elements")
    # Pass 2: join each chain of fragments into one unit.
    units: list[Unit] = []
    i = 0
    count = len(spans)
    while i < count:
        flags, start, length = spans[i]
        if not flags & CONTINUED:
            units.append(Unit(flags, bytes(view[start : start + length])))
            i += 1
            continue
        parts = [view[start : start + length]]
        i += 1
        while True:
            more, start, length = spans[i]
            parts.append(view[start : start + length])
            i += 1
            if not more & CONTINUED:
                break
        units.append(Unit(flags, b"".join(parts)))
    return units
