"""A simulcast layer's picture size, read from one RTP payload without decoding. Pure.

Rules:

- **Never an error.** Each reader returns ``(width, height)`` when the payload carries
  the size, else None: short, cut, garbage, another packet of the frame. The
  demultiplexer calls one on every packet of every layer (``bench/simulcast.py``), so
  each looks at the first one or two bytes before it parses anything, and a packet that
  cannot hold the size costs those looks only.
- **One parser per header.** The parameter sets and sequence headers are read by
  :mod:`pipeline.stream_profile` (the same code that reads the profile and level), the
  VP9 payload descriptor by :func:`pipeline.rtp_payload.vp9.parse_descriptor`; here is
  only where each sits in an RTP payload.
- **VP8** (RFC 7741 4.2, RFC 6386 9.1): the payload descriptor (X, I, L, T, K and a 7- or
  15-bit picture id), then, when the packet starts partition 0 of a keyframe, the start
  code and the 14-bit width and height (the 2-bit scale fields are ignored).
- **H.264** (RFC 6184 5.6-5.8, packetization-mode 1): an SPS (NAL type 7) as a single
  NAL unit packet, as a unit of a STAP-A (24), or as the start fragment of an FU-A (28,
  S set). A fragment is read when the SPS's fields up to the cropping window are in it
  (they are in its first bytes: the rest of the SPS is not needed); a start fragment
  too short for them is None. The size is the cropped one (H.264 7.4.2.1.1).
- **H.265** (RFC 7798 4.4): an SPS (type 33) as a single NAL unit packet, in an
  aggregation packet (48) or as the start of a fragmentation unit (49, S set; the same
  prefix rule as H.264), with the DONL/DOND fields when ``sprop-max-don-diff`` says so.
  The size is inside the conformance window (H.265 7.4.3.2).
- **AV1** (AV1 RTP payload format 4.4, 4.5): the OBU elements of the aggregation (leb128
  lengths, the last without one when W is set); a first element that continues an OBU
  (Z) is skipped; elements are walked while they are temporal delimiters or sequence
  headers, and the first sequence header gives ``max_frame_width``/``max_frame_height``
  (the AV1 specification 5.5.1). An OBU of any other type ends the walk: a sequence
  header comes before the frames of its temporal unit.
- **VP9** (RFC 9628 4.2, 4.2.1): the scalability structure's sizes when the V bit is set
  (the highest spatial layer's: that is the layer's picture), else, on the first packet
  of a frame that is not inter-picture predicted (B set, P clear) and has a keyframe's
  sync code in its first bytes (the cheap look: FFmpeg never sets P), the keyframe's
  uncompressed header (VP9 6.2). A layer with several spatial layers and no SS shows
  its base layer's size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pipeline.av1_obu import (
    EXTENSION_FLAG,
    HAS_SIZE_FIELD,
    OBU_SEQUENCE_HEADER,
    OBU_TEMPORAL_DELIMITER,
    read_leb128,
)
from pipeline.bitreader import BitstreamError
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.h265 import TYPE_AP, TYPE_FU, donl_from_fmtp
from pipeline.rtp_payload.vp9 import B_BIT, P_BIT, V_BIT, parse_descriptor
from pipeline.stream_profile import (
    H264_NAL_SPS,
    H265_NAL_SPS,
    MAX_PARAMETER_SET_BYTES,
    read_av1_sequence_header_size,
    read_h264_sps_size,
    read_h265_sps_size,
    read_vp9_keyframe_size,
)

Size = tuple[int, int]
SizeReader = Callable[[bytes], Size | None]

H264_STAP_A = 24
H264_FU_A = 28
FU_START = 0x80
AV1_Z_BIT = 0x80
AV1_Y_BIT = 0x40
AV1_W_MASK = 0x30
VP9_SYNC_FIRST = 0x49
"""The first byte of a keyframe's ``frame_sync_code`` (49 83 42): byte-aligned after the
first header byte in profiles 0..2."""
VP9_SYNC_PROFILE_3 = 0xC1
"""Its second byte one bit later (profile 3's reserved bit shifts the header)."""
VP9_SYNC_WITHIN = 12
"""A descriptor without SS is at most 5 bytes; the sync code ends by the frame's 5th."""


def size_reader(mime_type: str, parameters: Mapping[str, object]) -> SizeReader | None:
    """The reader for payloads of ``mime_type`` (``video/VP8`` ...) with these fmtp
    ``parameters``; None for a codec whose sizes are not read (none of the video ones)."""
    name = mime_type.lower()
    if name == "video/vp8":
        return vp8_keyframe_size
    if name == "video/h264":
        return h264_payload_size
    if name in ("video/h265", "video/hevc"):
        try:
            donl = donl_from_fmtp(parameters)
        except ValueError:
            donl = False
        return h265_payload_size_with_donl if donl else h265_payload_size
    if name == "video/av1":
        return av1_payload_size
    if name == "video/vp9":
        return vp9_payload_size
    return None


def vp8_keyframe_size(payload: bytes) -> Size | None:
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


def h264_payload_size(payload: bytes) -> Size | None:
    """(width, height) when ``payload`` (one H.264 RTP payload, RFC 6184) holds an SPS."""
    if not payload or payload[0] & 0x80:
        return None
    kind = payload[0] & 0x1F
    if kind == H264_NAL_SPS:
        return _h264_sps(payload, 1)
    if kind == H264_FU_A:
        if len(payload) > 2 and payload[1] & FU_START and payload[1] & 0x1F == H264_NAL_SPS:
            return _h264_sps(payload, 2)
        return None
    if kind != H264_STAP_A:
        return None
    at = 1
    end = len(payload)
    while at + 2 < end:
        length = payload[at] << 8 | payload[at + 1]
        at += 2
        if length == 0 or length > end - at:
            return None
        if payload[at] & 0x9F == H264_NAL_SPS:  # F clear, type 7
            return _h264_sps(payload[: at + length], at + 1)
        at += length
    return None


def _h264_sps(payload: bytes, start: int) -> Size | None:
    try:
        return read_h264_sps_size(payload[start : start + MAX_PARAMETER_SET_BYTES])
    except BitstreamError:
        return None


def h265_payload_size(payload: bytes, donl_fields: bool = False) -> Size | None:
    """(width, height) when ``payload`` (one H.265 RTP payload, RFC 7798; with DONL/DOND
    fields when ``donl_fields``) holds an SPS."""
    if len(payload) < 3 or payload[0] & 0x80:
        return None
    donl = 2 if donl_fields else 0
    kind = (payload[0] >> 1) & 0x3F
    if kind == H265_NAL_SPS:
        return _h265_sps(payload, 2 + donl)
    if kind == TYPE_FU:
        fu = payload[2]
        if fu & FU_START and fu & 0x3F == H265_NAL_SPS:
            return _h265_sps(payload, 3 + donl)
        return None
    if kind != TYPE_AP:
        return None
    at = 2
    end = len(payload)
    skip = donl  # the first unit's DONL, then a 1-byte DOND per unit
    while at + skip + 3 < end:
        at += skip
        skip = 1 if donl else 0
        length = payload[at] << 8 | payload[at + 1]
        at += 2
        if length < 3 or length > end - at:
            return None
        if payload[at] & 0x80 == 0 and (payload[at] >> 1) & 0x3F == H265_NAL_SPS:
            return _h265_sps(payload[: at + length], at + 2)
        at += length
    return None


def h265_payload_size_with_donl(payload: bytes) -> Size | None:
    """:func:`h265_payload_size` for a stream with DONL/DOND fields (sprop-max-don-diff > 0)."""
    return h265_payload_size(payload, True)


def _h265_sps(payload: bytes, start: int) -> Size | None:
    try:
        return read_h265_sps_size(payload[start : start + MAX_PARAMETER_SET_BYTES])
    except BitstreamError:
        return None


def av1_payload_size(payload: bytes) -> Size | None:
    """(width, height) when ``payload`` (one AV1 RTP payload) holds a sequence header."""
    if len(payload) < 2:
        return None
    aggregation = payload[0]
    count = (aggregation & AV1_W_MASK) >> 4
    continues = aggregation & AV1_Z_BIT
    if continues:
        if count == 1:
            return None  # one element, the rest of an OBU
    else:  # the cheap look: the first element's OBU type, when no leb128 call is needed
        first = 1 if count == 1 else 2 if payload[1] < 0x80 else 0
        if first and first < len(payload):
            kind = (payload[first] >> 3) & 0x0F
            if kind != OBU_SEQUENCE_HEADER and kind != OBU_TEMPORAL_DELIMITER:
                return None
    end = len(payload)
    at = 1
    index = 0
    try:
        while at < end:
            if count and index == count - 1:
                length = end - at
            else:
                length, at = read_leb128(payload, at)
                if length == 0 or length > end - at:
                    return None
            element = at
            at += length
            index += 1
            if continues and index == 1:
                continue
            header = payload[element]
            kind = (header >> 3) & 0x0F
            if header & 0x80 or kind not in (OBU_SEQUENCE_HEADER, OBU_TEMPORAL_DELIMITER):
                return None
            if kind == OBU_TEMPORAL_DELIMITER:
                continue
            body = element + (2 if header & EXTENSION_FLAG else 1)
            obu_end = at
            if header & HAS_SIZE_FIELD:
                size, body = read_leb128(payload[:at], body)
                obu_end = min(at, body + size)
            limit = min(obu_end, body + MAX_PARAMETER_SET_BYTES)
            return read_av1_sequence_header_size(payload[body:limit])
    except (BitstreamError, PayloadError):
        return None
    return None


def vp9_payload_size(payload: bytes) -> Size | None:
    """(width, height) when ``payload`` (one VP9 RTP payload, RFC 9628) carries a
    scalability structure with sizes, or starts a keyframe."""
    if not payload:
        return None
    first = payload[0]
    if not first & V_BIT:
        if not first & B_BIT or first & P_BIT:
            return None
        # Not a keyframe without the sync code's first byte (FFmpeg never sets P: most
        # frames come here). One-byte finds: a bytes needle costs several times more.
        if (
            payload.find(VP9_SYNC_FIRST, 1, VP9_SYNC_WITHIN) < 0
            and payload.find(VP9_SYNC_PROFILE_3, 1, VP9_SYNC_WITHIN) < 0
        ):
            return None
    try:
        descriptor = parse_descriptor(payload)
        scalability = descriptor.scalability
        if scalability is not None and scalability.resolutions:
            width, height = scalability.resolutions[-1]
            return (width, height) if width and height else None
        if not descriptor.begins or descriptor.inter_predicted:
            return None
        return read_vp9_keyframe_size(payload[descriptor.size :])
    except (BitstreamError, PayloadError):
        return None
