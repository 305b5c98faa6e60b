"""A strict reader of transport-wide feedback packets, written for the tests from the draft.

It shares nothing with :mod:`whip.rtc.twcc` (the builder under test): it reads the bytes
as draft-holmer-rmcat-transport-wide-cc-extensions-01 lays them out and refuses anything
that does not add up (version, packet type, length, padding, the reserved symbol, a delta
missing or left over). Times come back in 250 us ticks, absolute from the reference time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


class FeedbackFormatError(ValueError):
    """The bytes are not one well-formed transport-wide feedback packet."""


@dataclass(frozen=True)
class ParsedFeedback:
    sender_ssrc: int
    media_ssrc: int
    base_sequence: int
    reference_time: int
    """24 bits, units of 64 ms."""
    feedback_count: int
    statuses: list[tuple[int, int | None]]
    """(16-bit sequence number, arrival in ticks or None when reported not received)."""
    size: int


def _symbols_of(chunk: int) -> list[int]:
    if chunk & 0x8000 == 0:
        symbol, run = (chunk >> 13) & 0x3, chunk & 0x1FFF
        if run == 0:
            raise FeedbackFormatError("run-length chunk with a run of 0")
        return [symbol] * run
    if chunk & 0x4000 == 0:
        return [(chunk >> (13 - i)) & 0x1 for i in range(14)]
    return [(chunk >> (12 - 2 * i)) & 0x3 for i in range(7)]


def parse_feedback(data: bytes) -> ParsedFeedback:
    """Read one packet (module doc); raise :class:`FeedbackFormatError` on anything off."""
    if len(data) < 20 or len(data) % 4:
        raise FeedbackFormatError(f"{len(data)} bytes")
    first, packet_type, words = struct.unpack_from("!BBH", data)
    if first >> 6 != 2 or first & 0x1F != 15 or packet_type != 205:
        raise FeedbackFormatError(f"header {data[:2].hex()}")
    if (words + 1) * 4 != len(data):
        raise FeedbackFormatError(f"length field {words} for {len(data)} bytes")
    end = len(data)
    if first & 0x20:
        padding = data[-1]
        if padding == 0 or padding > end - 20 or any(data[end - padding : end - 1]):
            raise FeedbackFormatError(f"padding {padding}")
        end -= padding
    sender, media, base, count, reference_and_count = struct.unpack_from("!IIHHI", data, 4)
    reference = reference_and_count >> 8
    if reference >= 1 << 23:
        reference -= 1 << 24  # signed 24 bits
    position = 20
    symbols: list[int] = []
    while len(symbols) < count:
        if position + 2 > end:
            raise FeedbackFormatError("status chunks run past the packet")
        symbols.extend(_symbols_of(struct.unpack_from("!H", data, position)[0]))
        position += 2
    symbols = symbols[:count]
    if 3 in symbols:
        raise FeedbackFormatError("reserved status symbol")
    tick = reference * 256
    statuses: list[tuple[int, int | None]] = []
    for i, symbol in enumerate(symbols):
        sequence = (base + i) & 0xFFFF
        if symbol == 0:
            statuses.append((sequence, None))
            continue
        width = 1 if symbol == 1 else 2
        if position + width > end:
            raise FeedbackFormatError("receive deltas run past the packet")
        delta = int.from_bytes(data[position : position + width], "big", signed=width == 2)
        position += width
        tick += delta
        statuses.append((sequence, tick))
    if position != end and (first & 0x20 or end - position >= 4):
        raise FeedbackFormatError(f"{end - position} bytes left over")
    return ParsedFeedback(
        sender,
        media,
        base,
        reference_and_count >> 8,
        reference_and_count & 0xFF,
        statuses,
        len(data),
    )
