"""The offer policy: which offered sections and codecs the answer accepts. Pure.

Offer policy (:func:`plan_offer`): a section is accepted when it is audio or video, active,
``UDP/TLS/RTP/SAVPF`` (or ``RTP/SAVPF``), offered ``sendonly`` or ``sendrecv`` and has a
receivable codec: video H.264 with ``packetization-mode=1`` and a baseline (42), main
(4d) or high (64) ``profile-level-id`` (or none), or VP8; audio Opus 48000/2. RTX whose
``apt`` is a kept codec is kept too. Payload types keep the offer's preference order.
Other sections are rejected (port 0 in the answer). More than one sending audio or video
section is a 422 ``too_many_tracks`` (WHIP ingests one stream: one audio + one video);
no accepted section at all is a 422 ``nothing_receivable``.
"""

from __future__ import annotations

import re

from whip.sdp.model import (
    Codec,
    Direction,
    MediaSection,
    NothingReceivableError,
    OfferSummary,
    SectionPlan,
    SessionDescription,
    TooManyTracksError,
    UnsupportedMediaTypeError,
)
from whip.sdp.parse import DEFAULT_MAX_BYTES, PAYLOAD_TYPE, parse_offer

CONTENT_TYPE = "application/sdp"
RECEIVABLE_PROTOS = frozenset({"UDP/TLS/RTP/SAVPF", "RTP/SAVPF"})
H264_PROFILES = frozenset({0x42, 0x4D, 0x64})  # baseline family, main, high


def receivable(kind: str, codec: Codec) -> bool:
    """Whether the pipeline can decode ``codec`` in a section of ``kind`` (module rules)."""
    name = codec.encoding
    if kind == "video" and name == "h264" and codec.clock_rate == 90000:
        if codec.param("packetization-mode") != "1":
            return False
        plid = codec.param("profile-level-id")
        if plid is None:
            return True
        return (
            re.fullmatch(r"[0-9A-Fa-f]{6}", plid) is not None and int(plid[:2], 16) in H264_PROFILES
        )
    if kind == "video" and name == "vp8":
        return codec.clock_rate == 90000
    if kind == "audio" and name == "opus":
        return codec.clock_rate == 48000 and codec.channels == 2
    return False


def _rtx_for(codec: Codec, payload_types: set[int]) -> bool:
    apt = codec.param("apt") or ""
    return (
        codec.encoding == "rtx"
        and PAYLOAD_TYPE.fullmatch(apt) is not None
        and int(apt) in payload_types
    )


def _describe(codec: Codec) -> str:
    text = f"{codec.name}/{codec.clock_rate}"
    if codec.encoding == "h264":
        mode = codec.param("packetization-mode") or "0"
        text += f" packetization-mode={mode} profile-level-id={codec.param('profile-level-id')}"
    return text


def _rejection(section: MediaSection) -> str | None:
    if section.kind not in ("audio", "video"):
        return f"{section.kind} sections are not ingested"
    if not section.active:
        return "disabled by the offer (port 0)"
    if section.proto not in RECEIVABLE_PROTOS:
        return f"transport {section.proto} is not supported"
    if section.direction not in (Direction.SENDONLY, Direction.SENDRECV):
        return f"direction {section.direction}: a WHIP publisher must send"
    return None


def _plan(section: MediaSection) -> SectionPlan:
    base = (section.index, section.kind, section.mid)
    reason = _rejection(section)
    if reason is not None:
        return SectionPlan(*base, False, reason=reason)
    kept = tuple(c for c in section.codecs if receivable(section.kind, c))
    if not kept:
        offered = ", ".join(map(_describe, section.codecs)) or "none"
        return SectionPlan(*base, False, reason=f"no receivable codec (offered: {offered})")
    pts = tuple(c.payload_type for c in kept)
    rtx = tuple(c.payload_type for c in section.codecs if _rtx_for(c, set(pts)))
    return SectionPlan(*base, True, pts, rtx, kept)


def plan_offer(offer: SessionDescription) -> OfferSummary:
    """Decide per section what the answer accepts (module rules). Raises 422 errors."""
    for kind in ("audio", "video"):
        sending = [s for s in offer.media if s.kind == kind and _rejection(s) is None]
        if len(sending) > 1:
            where = ", ".join(f"line {s.line}" for s in sending)
            raise TooManyTracksError(
                f"{len(sending)} sending {kind} sections ({where}); one allowed"
            )
    summary = OfferSummary(tuple(map(_plan, offer.media)), offer.bundle)
    if not summary.accepted:
        why = "; ".join(f"section {p.index} ({p.kind}): {p.reason}" for p in summary.sections)
        raise NothingReceivableError(f"nothing receivable in the offer: {why}")
    return summary


def check_offer(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> OfferSummary:
    """Parse and plan an offer body. Raises only :class:`SdpError` subclasses."""
    return plan_offer(parse_offer(data, max_bytes=max_bytes))


def check_content_type(value: str | None) -> None:
    """415 unless the Content-Type is ``application/sdp`` (parameters ignored)."""
    if (value or "").split(";")[0].strip().lower() != CONTENT_TYPE:
        raise UnsupportedMediaTypeError(f"Content-Type must be {CONTENT_TYPE}, got {value!r}")
