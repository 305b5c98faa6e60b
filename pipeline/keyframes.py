"""Keyframe detection on encoded frames, as aiortc hands them over (sans-IO, pure).

A keyframe here means "a decoder with no prior state can start here": the intake uses
it to end a drop episode, the decode worker to resynchronise after an error.

- H.264: the frame is Annex-B (aiortc's depayloader emits ``00 00 00 01`` start codes;
  3-byte start codes are accepted too). It is a keyframe when it carries an IDR slice
  (NAL unit type 5). Parameter sets (SPS 7, PPS 8) or SEI alone are not enough: without
  the IDR slice there is no picture to start from. A non-IDR I slice with a recovery
  point SEI (open GOP, intra refresh) is deliberately *not* a keyframe: the decoder may
  show a damaged picture from it, and recovery waits for a real IDR.
- VP8 (RFC 6386 section 9.1): the payload descriptor is already stripped; bit 0 of the
  first byte is the inverse key-frame flag (0 = key frame), and a key frame carries the
  start code ``9d 01 2a`` at bytes 3..5. Both are checked, which rejects most garbage.
- H.265 (ITU-T H.265 7.4.2.2): Annex-B as :mod:`pipeline.rtp_payload.h265` writes it.
  A keyframe carries an IRAP picture: a VCL NAL unit of type 16..21 (BLA, IDR, CRA;
  22..23 are reserved IRAP types and do not count). As for H.264, VPS/SPS/PPS (32..34)
  or SEI alone are not enough. A CRA counts: a decoder starting there drops the RASL
  pictures that follow it (x265's open GOPs start every GOP after the first with one).
- AV1 (AV1 spec 7.5, 5.9.2): a low-overhead temporal unit (:mod:`pipeline.av1_obu`). A
  keyframe has a sequence header OBU, and after it the temporal unit's first frame
  header (in an OBU_FRAME_HEADER or OBU_FRAME) says ``frame_type == KEY_FRAME`` and
  ``show_frame`` (a coded video sequence must start so); ``show_existing_frame`` is not
  a keyframe. The one sequence-header field read is ``reduced_still_picture_header``
  (then the frame is a shown key frame by definition); the frame header's first bits are
  ``show_existing_frame``, ``frame_type`` (2 bits), ``show_frame``. A malformed OBU
  makes the unit not a keyframe.
- VP9 (VP9 spec 6.2): the uncompressed header of the first frame (a superframe's frames
  start at byte 0): ``frame_marker`` (2), ``profile`` (2 bits, low first; profile 3 has a
  reserved zero bit), ``show_existing_frame`` (must be 0), ``frame_type`` (0 =
  KEY_FRAME), ``show_frame``, ``error_resilient_mode``, then the key frame's sync code
  ``49 83 42``, checked too.

Every detector takes any bytes and returns a bool: none raises.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.av1_obu import (
    OBU_FRAME,
    OBU_FRAME_HEADER,
    OBU_SEQUENCE_HEADER,
    iter_obus,
)
from pipeline.rtp_payload.errors import PayloadError

H264_NAL_IDR = 5
H264_NAL_SPS = 7
H264_NAL_PPS = 8
_START_CODE = b"\x00\x00\x01"
_VP8_START_CODE = b"\x9d\x01\x2a"
VP8_KEYFRAME_HEADER_BYTES = 10
"""3-byte frame tag + 3-byte start code + 4 bytes of width and height."""
H265_IRAP_FIRST = 16
H265_IRAP_LAST = 21
H265_NAL_VPS = 32
H265_NAL_SPS = 33
H265_NAL_PPS = 34
AV1_KEY_FRAME = 0
VP9_FRAME_MARKER = 2
VP9_KEY_FRAME = 0
VP9_SYNC_CODE = 0x498342
VP9_KEYFRAME_HEADER_BYTES = 5
"""Up to 9 header bits, then the 24-bit sync code."""


def _nal_headers(annexb: bytes) -> Iterator[int]:
    """The first header byte of each NAL unit of an Annex-B buffer, in order, skipping
    those with the forbidden_zero_bit set (the same bit in H.264 and H.265)."""
    n = len(annexb)
    i = annexb.find(_START_CODE)
    while i >= 0 and i + 3 < n:
        header = annexb[i + 3]
        if header & 0x80 == 0:
            yield header
        i = annexb.find(_START_CODE, i + 3)


def h264_nal_types(annexb: bytes) -> list[int]:
    """The NAL unit types of an Annex-B buffer, in order (empty for no start code).

    A NAL whose header has the forbidden_zero_bit set is skipped (it is not H.264).
    """
    return [header & 0x1F for header in _nal_headers(annexb)]


def h264_is_keyframe(annexb: bytes) -> bool:
    """True when the Annex-B access unit carries an IDR slice (NAL type 5)."""
    return any(header & 0x1F == H264_NAL_IDR for header in _nal_headers(annexb))


def vp8_is_keyframe(frame: bytes) -> bool:
    """True for a VP8 key frame (RFC 6386 9.1: P bit clear and the key-frame start code)."""
    return (
        len(frame) >= VP8_KEYFRAME_HEADER_BYTES
        and frame[0] & 0x01 == 0
        and frame[3:6] == _VP8_START_CODE
    )


def h265_nal_types(annexb: bytes) -> list[int]:
    """The NAL unit types of an H.265 Annex-B buffer, in order (empty for no start code).

    A NAL whose header has the forbidden_zero_bit set is skipped (it is not H.265).
    """
    return [(header >> 1) & 0x3F for header in _nal_headers(annexb)]


def h265_is_keyframe(annexb: bytes) -> bool:
    """True when the Annex-B access unit carries an IRAP VCL NAL unit (types 16..21)."""
    return any(
        H265_IRAP_FIRST <= (header >> 1) & 0x3F <= H265_IRAP_LAST for header in _nal_headers(annexb)
    )


def av1_is_keyframe(temporal_unit: bytes) -> bool:
    """True for a temporal unit with a sequence header and, after it, a first frame
    header of a shown KEY_FRAME (rules in the module docstring)."""
    sequence_header = False
    reduced_still_picture = False
    try:
        for kind, payload in iter_obus(temporal_unit):
            if kind == OBU_SEQUENCE_HEADER:
                if not payload:
                    return False
                sequence_header = True
                # seq_profile f(3), still_picture f(1), reduced_still_picture_header f(1)
                reduced_still_picture = bool(payload[0] & 0x08)
            elif kind in (OBU_FRAME_HEADER, OBU_FRAME):
                if not sequence_header:
                    return False
                if reduced_still_picture:
                    return True
                if not payload:
                    return False
                first = payload[0]
                # show_existing_frame f(1), frame_type f(2), show_frame f(1)
                show_existing = first & 0x80
                frame_type = (first >> 5) & 0x03
                return not show_existing and frame_type == AV1_KEY_FRAME and bool(first & 0x10)
    except PayloadError:
        return False
    return False


def vp9_is_keyframe(frame: bytes) -> bool:
    """True when the (first) VP9 frame is a KEY_FRAME (rules in the module docstring)."""
    if len(frame) < VP9_KEYFRAME_HEADER_BYTES:
        return False
    bits = int.from_bytes(frame[:VP9_KEYFRAME_HEADER_BYTES])
    width = 8 * VP9_KEYFRAME_HEADER_BYTES
    position = 0

    def read(count: int) -> int:
        nonlocal position
        position += count
        return (bits >> (width - position)) & ((1 << count) - 1)

    if read(2) != VP9_FRAME_MARKER:
        return False
    low = read(1)
    profile = read(1) << 1 | low
    if profile == 3 and read(1):
        return False
    if read(1):  # show_existing_frame
        return False
    if read(1) != VP9_KEY_FRAME:
        return False
    read(2)  # show_frame, error_resilient_mode
    return read(24) == VP9_SYNC_CODE


def is_keyframe(codec: str, frame: bytes) -> bool:
    """Keyframe test by aiortc codec name (``H264``, ``VP8``, ``H265`` or ``HEVC``,
    ``AV1``, ``VP9``; case-insensitive).

    Audio codecs (``opus``, ``PCMU``, ...) have no inter-frame prediction that matters
    for resynchronisation: every non-empty audio frame is a keyframe. An unknown video
    codec is never a keyframe.
    """
    name = codec.upper()
    if name == "H264":
        return h264_is_keyframe(frame)
    if name == "VP8":
        return vp8_is_keyframe(frame)
    if name in ("H265", "HEVC"):
        return h265_is_keyframe(frame)
    if name == "AV1":
        return av1_is_keyframe(frame)
    if name == "VP9":
        return vp9_is_keyframe(frame)
    if name in AUDIO_CODECS:
        return len(frame) > 0
    return False


AUDIO_CODECS = frozenset({"OPUS", "PCMU", "PCMA", "G722"})
"""Upper-cased aiortc audio codec names."""
