"""AV1 OBU syntax: the few pieces both the RTP depacketizer and keyframe detection read
(sans-IO, pure).

Rules (AV1 Bitstream Specification 1.0.0 with Errata 1):

- 4.10.5 ``leb128()``: at most 8 bytes, 7 bits each, little-endian, the value below
  2**32. More than 8 bytes is ``leb128_too_long``, running past the data is
  ``leb128_truncated``, a value of 2**32 or more is ``leb128_overflow``.
- 5.3.2 OBU header: ``obu_forbidden_bit`` (must be 0: ``obu_forbidden_bit``),
  ``obu_type`` (4 bits), ``obu_extension_flag``, ``obu_has_size_field``,
  ``obu_reserved_1bit``; with the extension flag, one more byte (``temporal_id``,
  ``spatial_id``). A header past the data is ``obu_truncated``.
- 5.2 low-overhead bitstream format: OBUs back to back, each with ``obu_has_size_field``
  set; :func:`iter_obus` also accepts a last OBU without a size field (it then runs to
  the end of the data, as 5.3.1's ``sz`` allows).
- Every error is a :class:`~pipeline.rtp_payload.errors.PayloadError`.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.rtp_payload.errors import PayloadError

OBU_SEQUENCE_HEADER = 1
OBU_TEMPORAL_DELIMITER = 2
OBU_FRAME_HEADER = 3
OBU_TILE_GROUP = 4
OBU_METADATA = 5
OBU_FRAME = 6
OBU_REDUNDANT_FRAME_HEADER = 7
OBU_TILE_LIST = 8
OBU_PADDING = 15
DEFINED_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 15})
"""0 and 9..14 are reserved (5.3.2: a decoder ignores them)."""

HAS_SIZE_FIELD = 0x02
EXTENSION_FLAG = 0x04
TEMPORAL_DELIMITER = bytes((OBU_TEMPORAL_DELIMITER << 3 | HAS_SIZE_FIELD, 0))
"""A temporal delimiter OBU with its (zero) size field: ``12 00``."""

LEB128_MAX_BYTES = 8
LEB128_LIMIT = 1 << 32


def read_leb128(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    """``(value, offset after it)`` of the leb128 at ``offset`` (rules above)."""
    value = 0
    n = len(data)
    for i in range(LEB128_MAX_BYTES):
        if offset + i >= n:
            raise PayloadError("leb128_truncated", "leb128 past the data")
        byte = data[offset + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value >= LEB128_LIMIT:
                raise PayloadError("leb128_overflow", f"{value}")
            return value, offset + i + 1
    raise PayloadError("leb128_too_long", f"over {LEB128_MAX_BYTES} bytes")


def leb128(value: int) -> bytes:
    """The shortest leb128 encoding of ``0 <= value < 2**32``."""
    if not 0 <= value < LEB128_LIMIT:
        raise ValueError(f"leb128 value out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def header_length(first: int) -> int:
    """Bytes of the OBU header that starts with byte ``first`` (1, or 2 with the
    extension). Raises for the forbidden bit."""
    if first & 0x80:
        raise PayloadError("obu_forbidden_bit", f"header {first:#04x}")
    return 2 if first & EXTENSION_FLAG else 1


def obu_type(first: int) -> int:
    """``obu_type`` from the OBU header's first byte."""
    return (first >> 3) & 0x0F


def iter_obus(data: bytes | memoryview) -> Iterator[tuple[int, memoryview]]:
    """``(obu_type, payload)`` for each OBU of a low-overhead temporal unit (5.2), in
    order; ``payload`` excludes the header and size field. Raises :class:`PayloadError`
    on the first malformed OBU (the ones before it were yielded)."""
    view = memoryview(data)
    n = len(view)
    offset = 0
    while offset < n:
        first = view[offset]
        start = offset + header_length(first)
        if start > n:
            raise PayloadError("obu_truncated", "OBU header past the data")
        if first & HAS_SIZE_FIELD:
            size, start = read_leb128(view, start)
            if size > n - start:
                raise PayloadError("obu_size_mismatch", f"obu_size {size} past the data")
            end = start + size
        else:
            end = n
        yield obu_type(first), view[start:end]
        offset = end
