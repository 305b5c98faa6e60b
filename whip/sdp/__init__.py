"""SDP for WHIP: offer checks and answer policy. Pure: strings and bytes in, values out.

- :mod:`whip.sdp.model`: the errors (each with its HTTP status) and the data: parsed
  descriptions and the answer plan (:class:`OfferSummary`).
- :mod:`whip.sdp.parse`: the parsing rules (:func:`parse_offer`).
- :mod:`whip.sdp.offer_policy`: which sections and codecs are accepted
  (:func:`check_offer`, :func:`plan_offer`); :mod:`whip.sdp.codec_rules`: which video
  formats and fmtp the pipeline decodes, and the fmtp the answer gives each.
- :mod:`whip.sdp.answer`: the answer trimmed to the plan (:func:`finalize_answer`).

The names callers use are re-exported here.
"""

from whip.sdp.answer import add_host_candidates, finalize_answer
from whip.sdp.codec_rules import VIDEO_CODEC_NAMES, VideoCodecName
from whip.sdp.model import (
    AnswerMismatchError,
    Codec,
    Direction,
    MediaSection,
    NothingReceivableError,
    OfferSummary,
    SdpError,
    SdpTooLargeError,
    SectionPlan,
    SessionDescription,
    TooManyTracksError,
    UnprocessableOfferError,
    UnsupportedMediaTypeError,
)
from whip.sdp.offer_policy import (
    CONTENT_TYPE,
    DEFAULT_VIDEO_CODECS,
    H264_PROFILES,
    RECEIVABLE_PROTOS,
    check_content_type,
    check_offer,
    plan_offer,
    receivable,
)
from whip.sdp.parse import DEFAULT_MAX_BYTES, decode_body, parse_description, parse_offer

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_VIDEO_CODECS",
    "H264_PROFILES",
    "RECEIVABLE_PROTOS",
    "VIDEO_CODEC_NAMES",
    "AnswerMismatchError",
    "Codec",
    "Direction",
    "MediaSection",
    "NothingReceivableError",
    "OfferSummary",
    "SdpError",
    "SdpTooLargeError",
    "SectionPlan",
    "SessionDescription",
    "TooManyTracksError",
    "UnprocessableOfferError",
    "UnsupportedMediaTypeError",
    "VideoCodecName",
    "add_host_candidates",
    "check_content_type",
    "check_offer",
    "decode_body",
    "finalize_answer",
    "parse_description",
    "parse_offer",
    "plan_offer",
    "receivable",
]
