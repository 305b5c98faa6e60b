"""Fragmented MP4 structure: how much of a cut file is whole (sans-IO, pure).

Rules (ISO/IEC 14496-12 4.2): a file is a sequence of top-level boxes, each a 32-bit
big-endian size (including the 8-byte header) and a 4-character type; size 1 means a
64-bit size follows the type, size 0 means "to the end of the file" (never written by
FFmpeg's fragmenting muxer, and not trusted here). A fragmented file written with
``empty_moov`` is ``ftyp moov`` followed by ``moof mdat`` pairs (``sidx``/``mfra`` may
appear too).

:func:`complete_length` is the length of the longest prefix that ends after a whole
``mdat`` that follows a whole ``moof`` (or the closing ``mfra`` of a finished file), or
after the whole ``moov`` when no fragment is complete; 0 when even the header is cut. A
file cut by a crash (SIGKILL) truncated to that length plays every complete fragment and
nothing half-written.
"""

from __future__ import annotations

import struct

HEADER = 8


def top_level_boxes(data: bytes) -> list[tuple[bytes, int, int]]:
    """``(type, offset, size)`` of every whole top-level box, in order; stops at the
    first box that is cut or malformed."""
    boxes: list[tuple[bytes, int, int]] = []
    offset = 0
    n = len(data)
    while offset + HEADER <= n:
        size, kind = struct.unpack_from(">I4s", data, offset)
        if size == 1:
            if offset + 16 > n:
                break
            (size,) = struct.unpack_from(">Q", data, offset + 8)
            if size < 16:
                break
        elif size < HEADER:
            break
        if offset + size > n:
            break
        boxes.append((kind, offset, size))
        offset += size
    return boxes


def complete_length(data: bytes) -> int:
    """The whole prefix of a fragmented MP4 (module doc)."""
    end = 0
    previous = b""
    for kind, offset, size in top_level_boxes(data):
        if kind in (b"moov", b"mfra") or (kind == b"mdat" and previous == b"moof"):
            end = offset + size
        previous = kind
    return end
