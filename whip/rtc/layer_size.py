"""A simulcast layer's picture size, read from its RTP payloads without decoding. Pure.

:func:`vp8_keyframe_size` reads the VP8 payload descriptor (RFC 7741 section 4.2: the X,
I, L, T and K fields and a 7- or 15-bit picture id), and, when the packet starts
partition 0 of a keyframe, the keyframe's start code and its 14-bit width and height
(RFC 6386 section 9.1; the 2-bit scale fields are ignored). Anything shorter, another
partition, an interframe or a wrong start code is None, never an error: the demultiplexer
calls it on every packet of every layer (``bench/simulcast.py``).
Other codecs' sizes are not read here (their layers rank by bitrate).
"""

from __future__ import annotations


def vp8_keyframe_size(payload: bytes) -> tuple[int, int] | None:
    """(width, height) when ``payload`` (one VP8 RTP payload, RFC 7741) starts a keyframe."""
    if not payload:
        return None
    first = payload[0]
    at = 1
    if first & 0x80:
        if len(payload) < 2:
            return None
        flags = payload[1]
        at = 2
        if flags & 0x80:
            if len(payload) <= at:
                return None
            at += 2 if payload[at] & 0x80 else 1
        if flags & 0x40:
            at += 1
        if flags & 0x30:
            at += 1
    if not first & 0x10 or first & 0x07:
        return None  # not the start of partition 0
    frame = payload[at:]
    if len(frame) < 10 or frame[0] & 0x01 or frame[3:6] != b"\x9d\x01\x2a":
        return None
    width = (frame[6] | frame[7] << 8) & 0x3FFF
    height = (frame[8] | frame[9] << 8) & 0x3FFF
    return (width, height) if width and height else None
