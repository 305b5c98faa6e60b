"""aiortc negotiates every video format the pipeline decodes: H.265, AV1 and VP9 join its
table, and H.264 matches whatever profile the offer policy accepted.

Rules:

- :func:`install_video_codecs` (idempotent, process-wide; :func:`whip.app.create_app`
  calls it after the internals check) appends ``video/H265``, ``video/AV1`` and
  ``video/VP9`` at 90 kHz, each with ``nack``, ``nack pli``, ``goog-remb`` and an RTX
  format (``apt``), to ``aiortc.codecs.CODECS["video"]``, on payload types clear of
  aiortc's own (97-102). Only the payload type of an offer aiortc itself makes uses them:
  an answer takes the offer's.
- aiortc decides a match with ``is_codec_compatible`` (mime type and clock rate; for H.264
  also the packetization mode and a profile from its own short table, which has no High
  10 or 4:2:2). What is receivable, and the fmtp the answer gives, is the offer policy's
  (:mod:`whip.sdp.codec_rules`), applied by :func:`whip.rtc.transceiver_codecs.restrict_codecs`;
  so the replacement :func:`compatible` lets H.264 of the same packetization mode match
  whatever its profile and leaves every other pair to aiortc's function.
- An answer must reuse the offer's payload type, and aiortc does so only for 96-127
  (``aiortc.rtp.DYNAMIC_PAYLOAD_TYPES``): Chromium puts AV1 on 45, and some H.264
  profiles on 35-63, the range RFC 5761 leaves dynamic next to RTCP. aiortc answered those
  with its own table's number (105 for AV1), which the offer never named, so the section
  was rejected. :data:`DYNAMIC_PAYLOAD_TYPES` adds 35-63.
- Process-wide means an aiortc *publisher* in this process (the benches', the tests')
  offers the three formats too. It has no encoder for them: it sends the answer's first
  format, which is only one of the three when the server prefers it and the publisher
  offered nothing it prefers more (the default preference puts H.264 first).

aiortc names touched (:func:`internals_problems`): ``aiortc.codecs.CODECS`` (the dict
``RTCPeerConnection`` reads, one object), ``aiortc.rtcpeerconnection.is_codec_compatible``
(a module global ``find_common_codecs`` looks up per call) and
``aiortc.rtp.DYNAMIC_PAYLOAD_TYPES`` (read by ``find_common_codecs`` per call, nowhere
else).
"""

from __future__ import annotations

import inspect
from typing import Any

import aiortc.codecs
import aiortc.rtcpeerconnection
import aiortc.rtp
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpCodecParameters

_STOCK_COMPATIBLE = aiortc.rtcpeerconnection.is_codec_compatible
DYNAMIC_PAYLOAD_TYPES = frozenset({*range(35, 64), *range(96, 128)})
"""Payload types an answer takes from the offer (module rules)."""
ADDED_FORMATS = {"video/H265": 103, "video/AV1": 105, "video/VP9": 107}
"""mime type -> payload type (its RTX takes the next one)."""


def compatible(a: RTCRtpCodecParameters, b: RTCRtpCodecParameters) -> bool:
    """aiortc's ``is_codec_compatible`` (``a`` local, ``b`` remote), except that H.264 of
    equal packetization mode matches whatever the profiles (module rules)."""
    if a.mimeType.lower() == b.mimeType.lower() == "video/h264":
        if a.clockRate != b.clockRate:
            return False
        mode = "packetization-mode"
        return str(a.parameters.get(mode, 0)) == str(b.parameters.get(mode, 0))
    return bool(_STOCK_COMPATIBLE(a, b))


def _ours(codec: RTCRtpCodecParameters) -> bool:
    """One of the entries :func:`install_video_codecs` adds."""
    if codec.mimeType.lower() == "video/rtx":
        return codec.parameters.get("apt") in ADDED_FORMATS.values()
    return codec.mimeType in ADDED_FORMATS


def _entries(mime_type: str, payload_type: int) -> list[RTCRtpCodecParameters]:
    feedback = [
        RTCRtcpFeedback(type="nack"),
        RTCRtcpFeedback(type="nack", parameter="pli"),
        RTCRtcpFeedback(type="goog-remb"),
    ]
    return [
        RTCRtpCodecParameters(
            mimeType=mime_type, clockRate=90000, payloadType=payload_type, rtcpFeedback=feedback
        ),
        RTCRtpCodecParameters(
            mimeType="video/rtx",
            clockRate=90000,
            payloadType=payload_type + 1,
            parameters={"apt": payload_type},
        ),
    ]


def install_video_codecs() -> None:
    """Add the three formats to aiortc's table and relax H.264 matching (module rules).
    Idempotent. Call on the event loop thread (or before any peer connection exists)."""
    video: list[RTCRtpCodecParameters] = aiortc.codecs.CODECS["video"]
    present = {c.mimeType.lower() for c in video}
    for mime_type, payload_type in ADDED_FORMATS.items():
        if mime_type.lower() not in present:
            video.extend(_entries(mime_type, payload_type))
    aiortc.rtcpeerconnection.is_codec_compatible = compatible
    aiortc.rtp.DYNAMIC_PAYLOAD_TYPES = DYNAMIC_PAYLOAD_TYPES  # type: ignore[assignment]


def installed() -> bool:
    """Whether :func:`install_video_codecs` is in effect."""
    present = {c.mimeType.lower() for c in aiortc.codecs.CODECS["video"]}
    return (
        aiortc.rtcpeerconnection.is_codec_compatible is compatible
        and getattr(aiortc.rtp, "DYNAMIC_PAYLOAD_TYPES", None) is DYNAMIC_PAYLOAD_TYPES
        and all(m.lower() in present for m in ADDED_FORMATS)
    )


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    pc: Any = aiortc.rtcpeerconnection
    if pc.CODECS is not aiortc.codecs.CODECS or not isinstance(pc.CODECS.get("video"), list):
        problems.append("aiortc.rtcpeerconnection.CODECS is aiortc.codecs.CODECS")
    if not inspect.isfunction(_STOCK_COMPATIBLE):
        problems.append("aiortc.rtcpeerconnection.is_codec_compatible")
    common = inspect.getsource(pc.find_common_codecs)
    if "is_codec_compatible(codec, c)" not in common:
        problems.append("find_common_codecs calls is_codec_compatible(local, remote)")
    if "c.payloadType in rtp.DYNAMIC_PAYLOAD_TYPES" not in common:
        problems.append("find_common_codecs reads rtp.DYNAMIC_PAYLOAD_TYPES")
    if not set(range(96, 128)) <= set(aiortc.rtp.DYNAMIC_PAYLOAD_TYPES):
        problems.append("aiortc.rtp.DYNAMIC_PAYLOAD_TYPES holds 96-127")
    if "find_common_codecs(CODECS[media.kind]" not in inspect.getsource(pc.RTCPeerConnection):
        problems.append("RTCPeerConnection negotiates from CODECS[kind]")
    used = {c.payloadType for c in aiortc.codecs.CODECS["video"] if not _ours(c)}
    for payload_type in ADDED_FORMATS.values():
        if {payload_type, payload_type + 1} & used:
            problems.append(f"aiortc's video payload types overlap {payload_type}")
    return problems
