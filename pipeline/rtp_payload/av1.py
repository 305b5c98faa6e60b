"""AV1 RTP depacketizer (AOM "RTP Payload Format For AV1" v1.0), sans-IO; output a
low-overhead temporal unit.

Payload format rules applied (section numbers of that document):

- 4.4 aggregation header ``Z Y W(2) N - - -``: Z, the first OBU element continues an
  OBU from the previous packet; Y, the last one continues in the next packet; W, 0 (every
  element has a leb128 length) or the element count (the last element has no length and
  runs to the end of the payload); N, the first packet of a coded video sequence
  (``keyframe``). N with Z is refused (``n_with_z``: the note under 4.4).
- 4.5 OBU elements: leb128 lengths (AV1 4.10.5: at most 8 bytes), an element past the
  payload (``obu_element_length``), an empty element (``empty_obu_element``), fewer
  elements than W says (``obu_count_mismatch``) and a payload with none
  (``no_obu_elements``) are refused.
- 5 packetization: temporal delimiter and tile list OBUs are ignored by receivers (they
  are dropped and counted: ``dropped["temporal_delimiter"]``, ``dropped["tile_list"]``);
  so are reserved OBU types (AV1 5.3.2 says a decoder ignores them:
  ``dropped["reserved_obu"]``). OBU extension headers are kept.
- 4.5: ``obu_has_size_field`` SHOULD be 0 in RTP but may be 1; an OBU that has one must
  be exactly as long as it says (``obu_size_mismatch``).

Why the frame step: an OBU fragmented over packets only has a known length once all its
fragments are in, and the low-overhead format needs that length (``obu_size``) in front
of the OBU. So the per-packet step emits fragment elements
(:mod:`pipeline.rtp_payload.fragments`) and :meth:`Av1Depacketizer.assemble` joins each
OBU, drops what the rules drop, sets ``obu_has_size_field`` and writes ``obu_size``, and
starts the temporal unit with a temporal delimiter (AV1 7.5: every temporal unit starts
with one). The RTP marker bit ends a temporal unit (4.2).
"""

from __future__ import annotations

from pipeline.av1_obu import (
    DEFINED_TYPES,
    HAS_SIZE_FIELD,
    OBU_TEMPORAL_DELIMITER,
    OBU_TILE_LIST,
    TEMPORAL_DELIMITER,
    header_length,
    leb128,
    obu_type,
    read_leb128,
)
from pipeline.rtp_payload.depacketizer import (
    AssembledFrame,
    DepacketizedPacket,
    Depacketizer,
)
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.fragments import CONTINUED, CONTINUES, KEY, element, join_units

Z_BIT = 0x80
Y_BIT = 0x40
W_MASK = 0x30
N_BIT = 0x08


class Av1Depacketizer(Depacketizer):
    """AV1 RTP payloads to low-overhead temporal units (see the module rules)."""

    codec = "AV1"

    def _packet(self, payload: bytes) -> DepacketizedPacket:
        n = len(payload)
        if n < 1:
            raise PayloadError("truncated", "empty payload")
        aggregation = payload[0]
        z = bool(aggregation & Z_BIT)
        y = bool(aggregation & Y_BIT)
        w = (aggregation & W_MASK) >> 4
        key = bool(aggregation & N_BIT)
        if key and z:
            raise PayloadError("n_with_z", "N and Z both set")
        offset = 1
        bodies: list[bytes] = []
        while offset < n:
            if w and len(bodies) == w - 1:
                length = n - offset
            else:
                length, offset = read_leb128(payload, offset)
                if length > n - offset:
                    raise PayloadError("obu_element_length", f"{length} past the payload")
            if length == 0:
                raise PayloadError("empty_obu_element", "an OBU element of 0 bytes")
            bodies.append(payload[offset : offset + length])
            offset += length
        if not bodies:
            raise PayloadError("no_obu_elements", "aggregation header only")
        if w and len(bodies) != w:
            raise PayloadError("obu_count_mismatch", f"W={w}, {len(bodies)} elements")
        last = len(bodies) - 1
        parts = []
        for i, body in enumerate(bodies):
            flags = 0
            if i == 0:
                flags |= (CONTINUES if z else 0) | (KEY if key else 0)
            if i == last and y:
                flags |= CONTINUED
            parts.append(element(flags, body))
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return DepacketizedPacket(data, not z, not y, not z, key)

    def _frame(self, data: bytes) -> AssembledFrame:
        units = join_units(data, self.max_frame_bytes)
        out: list[bytes | memoryview] = [TEMPORAL_DELIMITER]
        dropped = self.dropped
        for unit in units:
            obu = unit.body
            first = obu[0]
            header = header_length(first)
            if header > len(obu):
                raise PayloadError("obu_truncated", "OBU header past the OBU")
            kind = obu_type(first)
            if kind == OBU_TEMPORAL_DELIMITER:
                dropped["temporal_delimiter"] += 1
                continue
            if kind == OBU_TILE_LIST:
                dropped["tile_list"] += 1
                continue
            if kind not in DEFINED_TYPES:
                dropped["reserved_obu"] += 1
                continue
            if first & HAS_SIZE_FIELD:
                size, start = read_leb128(obu, header)
                if start + size != len(obu):
                    raise PayloadError(
                        "obu_size_mismatch", f"obu_size {size}, {len(obu) - start} bytes"
                    )
                out.append(obu)
            else:
                payload = memoryview(obu)[header:]
                out.append(bytes((first | HAS_SIZE_FIELD,)))
                if header == 2:
                    out.append(obu[1:2])
                out.append(leb128(len(payload)))
                out.append(payload)
        if len(out) == 1:
            raise PayloadError("empty_frame", "no OBU left after the drops")
        keyframe_hint = bool(units[0].flags & KEY)
        return AssembledFrame(b"".join(out), keyframe_hint)
