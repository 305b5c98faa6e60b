"""What a muxer needs to know of a track before its first packet (sans-IO, pure).

Rules:

- The codec's FFmpeg name comes from the RTP encoding name (:data:`FFMPEG_CODECS`);
  a codec that is not there is not recorded (:func:`ffmpeg_codec` says None).
- Extradata is read from a keyframe, as the depacketizer delivers it:
  H.264: the SPS (NAL type 7) and PPS (8) in Annex B, 4-byte start codes, in the order
  they appear; H.265: VPS (32), SPS (33), PPS (34) the same way (FFmpeg's MP4 muxer
  turns Annex B extradata into ``avcC``/``hvcC`` itself, and converts the Annex B
  samples to length-prefixed NAL units with it); AV1: the sequence header OBU, written
  back with its size field (the MP4 muxer builds ``av1C`` from it); VP8 and VP9: none.
- A keyframe without the parameter sets its codec needs gives None: the recorder waits
  for a keyframe that has them (a segment must open decodable).
- :func:`config_signature` is what must stay the same within one segment: the
  extradata for H.264/H.265/AV1, the frame size of a VP8 keyframe header. A keyframe
  whose signature differs from the segment's starts a new segment (a simulcast layer
  switch changes the size). VP9's size sits behind variable-length header fields: its
  signature is None and the recorder compares the decoded size instead.
- Opus: :func:`opus_head` builds the ``OpusHead`` identification header (RFC 7845
  5.1) the MP4 muxer turns into ``dOps``; WebRTC's Opus is 48 kHz, stereo in the SDP,
  channel mapping family 0, no pre-skip known (0).

Every function takes any bytes and never raises for bad media.
"""

from __future__ import annotations

import struct

from pipeline.av1_obu import HAS_SIZE_FIELD, OBU_SEQUENCE_HEADER, iter_obus, leb128
from pipeline.rtp_payload.errors import PayloadError

FFMPEG_CODECS = {
    "H264": "h264",
    "H265": "hevc",
    "HEVC": "hevc",
    "AV1": "av1",
    "VP9": "vp9",
    "VP8": "vp8",
    "OPUS": "opus",
}
"""RTP encoding name (upper case) -> FFmpeg codec name."""

_START_CODE = b"\x00\x00\x01"
_LONG_START_CODE = b"\x00\x00\x00\x01"
H264_PARAMETER_SETS = (7, 8)
H265_PARAMETER_SETS = (32, 33, 34)
OPUS_SAMPLE_RATE = 48000


def ffmpeg_codec(codec: str) -> str | None:
    """FFmpeg's name for the RTP encoding ``codec``, or None (not recordable)."""
    return FFMPEG_CODECS.get(codec.upper())


def nal_units(annexb: bytes) -> list[bytes]:
    """The NAL units of an Annex B buffer, start codes removed (3- or 4-byte ones; the
    zero byte of a 4-byte start code is not part of the NAL unit before it)."""
    units: list[bytes] = []
    i = annexb.find(_START_CODE)
    while i >= 0:
        start = i + 3
        nxt = annexb.find(_START_CODE, start)
        end = len(annexb) if nxt < 0 else nxt
        if nxt >= 0 and end > start and annexb[end - 1] == 0:
            end -= 1  # the leading zero of a 4-byte start code
        if end > start:
            units.append(annexb[start:end])
        i = nxt
    return units


def _parameter_sets(annexb: bytes, wanted: tuple[int, ...], hevc: bool) -> bytes | None:
    found: dict[int, bytes] = {}
    order: list[bytes] = []
    for unit in nal_units(annexb):
        kind = (unit[0] >> 1) & 0x3F if hevc else unit[0] & 0x1F
        if kind in wanted and kind not in found:
            found[kind] = unit
            order.append(unit)
    if len(found) != len(wanted):
        return None
    return b"".join(_LONG_START_CODE + unit for unit in order)


def _av1_sequence_header(temporal_unit: bytes) -> bytes | None:
    try:
        for kind, payload in iter_obus(temporal_unit):
            if kind == OBU_SEQUENCE_HEADER:
                body = bytes(payload)
                header = bytes((OBU_SEQUENCE_HEADER << 3 | HAS_SIZE_FIELD,))
                return header + leb128(len(body)) + body
    except PayloadError:
        return None
    return None


def video_extradata(codec: str, keyframe: bytes) -> bytes | None:
    """The extradata the muxer needs for ``codec``, read from ``keyframe``; ``b""`` for
    a codec that needs none; None when the keyframe lacks it (module doc)."""
    name = codec.upper()
    if name == "H264":
        return _parameter_sets(keyframe, H264_PARAMETER_SETS, hevc=False)
    if name in ("H265", "HEVC"):
        return _parameter_sets(keyframe, H265_PARAMETER_SETS, hevc=True)
    if name == "AV1":
        return _av1_sequence_header(keyframe)
    return b""


def vp8_keyframe_size(frame: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a VP8 keyframe header (RFC 6386 9.1: 14 bits each after
    the start code, the top 2 bits are the scale), or None for another frame."""
    if len(frame) < 10 or frame[0] & 1 or frame[3:6] != b"\x9d\x01\x2a":
        return None
    width, height = struct.unpack_from("<HH", frame, 6)
    return width & 0x3FFF, height & 0x3FFF


def config_signature(codec: str, keyframe: bytes) -> bytes | None:
    """What must stay the same within a segment (module doc); None: nothing to compare
    (VP9, or a keyframe that lacks its parameter sets)."""
    name = codec.upper()
    if name == "VP8":
        size = vp8_keyframe_size(keyframe)
        return struct.pack("<HH", *size) if size is not None else None
    if name == "VP9":
        return None
    return video_extradata(codec, keyframe) or None


def opus_head(channels: int = 2) -> bytes:
    """An ``OpusHead`` (RFC 7845 5.1): version 1, ``channels``, pre-skip 0, 48 kHz
    input rate, gain 0, mapping family 0."""
    return b"OpusHead" + struct.pack("<BBHIhB", 1, channels, 0, OPUS_SAMPLE_RATE, 0, 0)
