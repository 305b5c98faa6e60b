"""An MSB-first bit reader for parameter sets and sequence headers (sans-IO, pure).

Rules:

- Every read is bounded by the data: reading past the end raises
  :class:`BitstreamError` (``truncated``), never an ``IndexError``; callers that must
  never raise (:mod:`pipeline.stream_profile`) catch that one error type.
- Exp-Golomb codes (ITU-T H.264 / H.265 clause 9.2) are bounded: more than
  :data:`MAX_LEADING_ZEROS` leading zero bits is ``exp_golomb_too_long`` (a valid
  ``ue(v)`` in a parameter set fits 32 bits), so garbage of zeros cannot make a huge
  number or a long loop.
- AV1's ``uvlc()`` (AV1 spec 4.10.3) follows its own rule: 32 leading zeros read as
  ``2**32 - 1`` (the spec's value); reading stops there rather than scanning on for the
  closing one bit the spec would skip.
- :func:`strip_emulation_prevention` turns an H.264/H.265 NAL unit payload (NAL unit
  syntax, clause 7.3.1) into its RBSP: every ``00 00 03`` loses the ``03``.
"""

from __future__ import annotations

MAX_LEADING_ZEROS = 31
"""ue(v) up to 2**32 - 2: the largest any parameter-set field may take."""
UVLC_MAX = (1 << 32) - 1


class BitstreamError(Exception):
    """The bits end early or break a bound (``code`` says which)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code


def strip_emulation_prevention(payload: bytes) -> bytes:
    """The RBSP of a NAL unit payload: each ``00 00 03`` becomes ``00 00``.

    Linear in the payload; a payload without ``00 00 03`` is returned as is.
    """
    if b"\x00\x00\x03" not in payload:
        return payload
    out = bytearray()
    zeros = 0
    for byte in payload:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


class BitReader:
    """Reads ``data`` from its first bit, most significant bit first (module doc)."""

    __slots__ = ("_data", "_limit", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self._limit = len(data) * 8

    @property
    def position(self) -> int:
        """Bits read so far."""
        return self._pos

    def bits_left(self) -> int:
        return self._limit - self._pos

    def u(self, count: int) -> int:
        """The next ``count`` bits as an unsigned integer (``count`` 0..64)."""
        if count < 0 or count > 64:
            raise ValueError(f"bit count {count} out of 0..64")
        if count > self._limit - self._pos:
            raise BitstreamError("truncated", f"{count} bits wanted at bit {self._pos}")
        value = 0
        pos = self._pos
        data = self._data
        for _ in range(count):
            value = (value << 1) | ((data[pos >> 3] >> (7 - (pos & 7))) & 1)
            pos += 1
        self._pos = pos
        return value

    def flag(self) -> bool:
        return self.u(1) == 1

    def skip(self, count: int) -> None:
        """Skip ``count`` bits (bounded like a read)."""
        if count < 0 or count > self._limit - self._pos:
            raise BitstreamError("truncated", f"skip {count} at bit {self._pos}")
        self._pos += count

    def ue(self) -> int:
        """Unsigned exp-Golomb ``ue(v)``, bounded (module doc)."""
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > MAX_LEADING_ZEROS:
                raise BitstreamError("exp_golomb_too_long", f"at bit {self._pos}")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        """Signed exp-Golomb ``se(v)``: 1, -1, 2, -2, ... for codes 1, 2, 3, 4, ..."""
        code = self.ue()
        return (code + 1) // 2 if code & 1 else -(code // 2)

    def uvlc(self) -> int:
        """AV1 ``uvlc()`` (module doc)."""
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros >= 32:
                return UVLC_MAX
        return (1 << zeros) - 1 + self.u(zeros)
