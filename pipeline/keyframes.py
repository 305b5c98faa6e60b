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
"""

from __future__ import annotations

H264_NAL_IDR = 5
H264_NAL_SPS = 7
H264_NAL_PPS = 8
_START_CODE = b"\x00\x00\x01"
_VP8_START_CODE = b"\x9d\x01\x2a"
VP8_KEYFRAME_HEADER_BYTES = 10
"""3-byte frame tag + 3-byte start code + 4 bytes of width and height."""


def h264_nal_types(annexb: bytes) -> list[int]:
    """The NAL unit types of an Annex-B buffer, in order (empty for no start code).

    A NAL whose header has the forbidden_zero_bit set is skipped (it is not H.264).
    """
    types: list[int] = []
    n = len(annexb)
    i = annexb.find(_START_CODE)
    while i >= 0 and i + 3 < n:
        header = annexb[i + 3]
        if header & 0x80 == 0:
            types.append(header & 0x1F)
        i = annexb.find(_START_CODE, i + 3)
    return types


def h264_is_keyframe(annexb: bytes) -> bool:
    """True when the Annex-B access unit carries an IDR slice (NAL type 5)."""
    n = len(annexb)
    i = annexb.find(_START_CODE)
    while i >= 0 and i + 3 < n:
        header = annexb[i + 3]
        if header & 0x80 == 0 and header & 0x1F == H264_NAL_IDR:
            return True
        i = annexb.find(_START_CODE, i + 3)
    return False


def vp8_is_keyframe(frame: bytes) -> bool:
    """True for a VP8 key frame (RFC 6386 9.1: P bit clear and the key-frame start code)."""
    return (
        len(frame) >= VP8_KEYFRAME_HEADER_BYTES
        and frame[0] & 0x01 == 0
        and frame[3:6] == _VP8_START_CODE
    )


def is_keyframe(codec: str, frame: bytes) -> bool:
    """Keyframe test by aiortc codec name (``H264``, ``VP8``; case-insensitive).

    Audio codecs (``opus``, ``PCMU``, ...) have no inter-frame prediction that matters
    for resynchronisation: every non-empty audio frame is a keyframe. An unknown video
    codec is never a keyframe (the receivable set in ``whip/sdp.py`` is H.264 and VP8).
    """
    name = codec.upper()
    if name == "H264":
        return h264_is_keyframe(frame)
    if name == "VP8":
        return vp8_is_keyframe(frame)
    if name in AUDIO_CODECS:
        return len(frame) > 0
    return False


AUDIO_CODECS = frozenset({"OPUS", "PCMU", "PCMA", "G722"})
"""Upper-cased aiortc audio codec names."""
