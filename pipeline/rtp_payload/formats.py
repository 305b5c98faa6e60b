"""Which depacketizer a negotiated codec gets (sans-IO, pure).

Rules: the codec is named by its RTP encoding name (aiortc's ``RTCRtpCodecParameters.name``,
case-insensitive; ``HEVC`` is accepted for H.265), its fmtp ``parameters`` are aiortc's
parsed ``a=fmtp`` (values are ``int`` or ``str``). Only H.265 reads a parameter
(``sprop-max-don-diff``, :func:`pipeline.rtp_payload.h265.donl_from_fmtp`). A codec
without a depacketizer here (H.264, VP8: aiortc's own) is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.rtp_payload.av1 import Av1Depacketizer
from pipeline.rtp_payload.depacketizer import DEFAULT_MAX_FRAME_BYTES, Depacketizer
from pipeline.rtp_payload.h265 import H265Depacketizer, donl_from_fmtp
from pipeline.rtp_payload.vp9 import Vp9Depacketizer

CODECS = frozenset({"H265", "AV1", "VP9"})
"""Upper-cased encoding names this package depacketizes."""


def depacketizer_for(
    codec: str,
    parameters: Mapping[str, object],
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> Depacketizer | None:
    """A new depacketizer for one track of ``codec``, or None when this package has none.
    Raises ``ValueError`` for fmtp values the format forbids (an SDP error: 400)."""
    name = codec.upper()
    if name in ("H265", "HEVC"):
        return H265Depacketizer(donl=donl_from_fmtp(parameters), max_frame_bytes=max_frame_bytes)
    if name == "AV1":
        return Av1Depacketizer(max_frame_bytes=max_frame_bytes)
    if name == "VP9":
        return Vp9Depacketizer(max_frame_bytes=max_frame_bytes)
    return None
