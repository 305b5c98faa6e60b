"""H.265 RTP depacketizer (RFC 7798), sans-IO; output Annex-B.

RFC 7798 rules applied:

- 1.1.4 / 4.4 payload header: the 2-byte NAL unit header (F, Type, LayerId, TID). F set
  (``forbidden_bit``) or TID 0 (``bad_nal_header``) is refused.
- 4.4.1 single NAL unit packet (Type 0..47): the payload is the NAL unit; with DONL
  present, a 16-bit DONL sits between the header and the NAL unit payload.
- 4.4.2 aggregation packet (Type 48): aggregation units of ``[DONL or DOND] size(16)
  NAL unit``; the first carries a 16-bit DONL, the later ones an 8-bit DOND (DON = the
  previous DON + DOND + 1, modulo 2**16). A size of 0, a size past the packet, a
  trailing partial unit or an AP with no unit is ``aggregation_length``; an aggregated
  NAL unit must have a valid header and may not itself be an AP, FU or PACI
  (``bad_nal_header``).
- 4.4.3 fragmentation unit (Type 49): ``FU header (S, E, FuType)``, a DONL only in the
  fragment with S, then the fragment. S and E both set (``fu_start_and_end``), an FuType
  of 48..50 (``fu_bad_type``) and an empty fragment (``fu_empty``) are refused. The NAL
  header is rebuilt from the payload header's F, LayerId and TID and FuType.
  A lost S or E fragment is caught at the frame step (``frame_start_missing``,
  ``fragment_without_start``, ``fragment_without_end``, ``frame_end_missing``).
- 4.4.4 PACI (Type 50): dropped and counted (``dropped["paci"]``), never an error.
- Types 51..63 are unspecified by RFC 7798: ``reserved_type``.
- 6 (DON): DONL/DOND are present iff ``sprop-max-don-diff`` > 0 (the constructor's
  ``donl``). The frame step puts the frame's NAL units in DON order (a stable sort on
  the signed DON distance from the frame's first NAL unit, modulo 2**16: right while a
  frame's DONs span less than 2**15, which sprop-max-don-diff <= 32767 keeps). Interleaving *across*
  RTP timestamps cannot be undone here: aiortc's jitter buffer has already cut frames by
  timestamp; a sender doing that is out of reach (none of FFmpeg, GStreamer,
  libwebrtc or OBS does).
- Every NAL unit is written with a 4-byte start code. The RTP marker bit ends an access
  unit (4.1).
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.rtp_payload.depacketizer import (
    DEFAULT_MAX_FRAME_BYTES,
    AssembledFrame,
    DepacketizedPacket,
    Depacketizer,
)
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.fragments import CONTINUED, CONTINUES, DON, Unit, element, join_units

TYPE_AP = 48
TYPE_FU = 49
TYPE_PACI = 50
START_CODE = b"\x00\x00\x00\x01"
MAX_DON_DIFF = 32767
"""RFC 7798 7.1: sprop-max-don-diff is an integer in 0..32767."""

_WHOLE = DepacketizedPacket(b"", begins=True, ends=True, frame_start=True, keyframe=False)


def donl_from_fmtp(parameters: Mapping[str, object]) -> bool:
    """Whether DONL/DOND fields are present, from the fmtp parameters
    (``sprop-max-don-diff`` > 0). Raises ``ValueError`` for a value outside 0..32767."""
    raw = parameters.get("sprop-max-don-diff")
    if raw is None:
        return False
    try:
        value = int(str(raw))
    except ValueError:
        raise ValueError(f"sprop-max-don-diff is not an integer: {raw!r}") from None
    if not 0 <= value <= MAX_DON_DIFF:
        raise ValueError(f"sprop-max-don-diff {value} is outside 0..{MAX_DON_DIFF}")
    return value > 0


def _check_header(b0: int, b1: int) -> int:
    """The NAL unit type of a 2-byte header, after the F and TID checks."""
    if b0 & 0x80:
        raise PayloadError("forbidden_bit", "F bit set")
    if b1 & 0x07 == 0:
        raise PayloadError("bad_nal_header", "TID 0")
    return (b0 >> 1) & 0x3F


class H265Depacketizer(Depacketizer):
    """RFC 7798 payloads to Annex-B access units (see the module rules)."""

    codec = "H265"

    def __init__(
        self, *, donl: bool = False, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        super().__init__(max_frame_bytes=max_frame_bytes)
        self.donl = donl
        """DONL/DOND fields are present (``sprop-max-don-diff`` > 0: :func:`donl_from_fmtp`)."""

    def _packet(self, payload: bytes) -> DepacketizedPacket:
        n = len(payload)
        if n < 2:
            raise PayloadError("truncated", f"{n} bytes")
        b0 = payload[0]
        b1 = payload[1]
        nal_type = _check_header(b0, b1)
        if nal_type < TYPE_AP:
            return self._single(payload)
        if nal_type == TYPE_AP:
            return self._aggregation(payload)
        if nal_type == TYPE_FU:
            return self._fragment(payload, b0, b1)
        if nal_type == TYPE_PACI:
            self.dropped["paci"] += 1
            return _WHOLE
        raise PayloadError("reserved_type", f"payload type {nal_type}")

    def _single(self, payload: bytes) -> DepacketizedPacket:
        if not self.donl:
            body = payload
            flags = 0
        else:
            if len(payload) < 4:
                raise PayloadError("truncated", "single NAL unit without its DONL")
            body = payload[2:4] + payload[:2] + payload[4:]
            flags = DON
        return DepacketizedPacket(element(flags, body), True, True, True, False)

    def _aggregation(self, payload: bytes) -> DepacketizedPacket:
        n = len(payload)
        offset = 2
        don = -1
        parts: list[bytes] = []
        while offset < n:
            if self.donl:
                if don < 0:
                    if n - offset < 2:
                        raise PayloadError("aggregation_length", "DONL past the packet")
                    don = int.from_bytes(payload[offset : offset + 2])
                    offset += 2
                else:
                    don = (don + payload[offset] + 1) & 0xFFFF
                    offset += 1
            if n - offset < 2:
                raise PayloadError("aggregation_length", "unit size past the packet")
            size = int.from_bytes(payload[offset : offset + 2])
            offset += 2
            if size < 2 or size > n - offset:
                raise PayloadError("aggregation_length", f"unit of {size} bytes")
            if _check_header(payload[offset], payload[offset + 1]) >= TYPE_AP:
                raise PayloadError("bad_nal_header", "an AP, FU or PACI inside an AP")
            nal = payload[offset : offset + size]
            offset += size
            if self.donl:
                parts.append(element(DON, don.to_bytes(2) + nal))
            else:
                parts.append(element(0, nal))
        if not parts:
            raise PayloadError("aggregation_length", "an AP with no unit")
        return DepacketizedPacket(b"".join(parts), True, True, True, False)

    def _fragment(self, payload: bytes, b0: int, b1: int) -> DepacketizedPacket:
        if len(payload) < 3:
            raise PayloadError("truncated", "FU without its FU header")
        fu = payload[2]
        start = bool(fu & 0x80)
        end = bool(fu & 0x40)
        fu_type = fu & 0x3F
        if start and end:
            raise PayloadError("fu_start_and_end", "S and E both set")
        if fu_type >= TYPE_AP:
            raise PayloadError("fu_bad_type", f"FuType {fu_type}")
        flags = (0 if start else CONTINUES) | (0 if end else CONTINUED)
        if start:
            header = bytes(((b0 & 0x81) | (fu_type << 1), b1))
            if self.donl:
                if len(payload) < 6:
                    raise PayloadError("fu_empty", "FU start without DONL and data")
                body = payload[3:5] + header + payload[5:]
                flags |= DON
            else:
                if len(payload) < 4:
                    raise PayloadError("fu_empty", "FU without data")
                body = header + payload[3:]
        else:
            if len(payload) < 4:
                raise PayloadError("fu_empty", "FU without data")
            body = payload[3:]
        return DepacketizedPacket(element(flags, body), start, end, start, False)

    def _frame(self, data: bytes) -> AssembledFrame:
        units = join_units(data, self.max_frame_bytes)
        if self.donl:
            first = int.from_bytes(units[0].body[:2])

            def distance(unit: Unit) -> int:
                # Signed DON distance from the frame's first unit, modulo 2**16.
                return ((int.from_bytes(unit.body[:2]) - first + 0x8000) & 0xFFFF) - 0x8000

            nals = [u.body[2:] for u in sorted(units, key=distance)]
        else:
            nals = [u.body for u in units]
        return AssembledFrame(START_CODE + START_CODE.join(nals), False)
