"""The offer policy: which offered sections and codecs the answer accepts. Pure.

Offer policy (:func:`plan_offer`): a section is accepted when it is audio or video, active,
``UDP/TLS/RTP/SAVPF`` (or ``RTP/SAVPF``), offered ``sendonly`` or ``sendrecv`` and has a
receivable codec. Video: a format named in the server's preference list
(``pipeline.video_codecs``) whose fmtp the pipeline decodes (:mod:`whip.sdp.codec_rules`:
H.264 with ``packetization-mode=1`` and a decodable profile, H.265, AV1, VP9, VP8);
audio: Opus 48000/2. RTX whose ``apt`` is a kept codec is kept too. Video payload types
are ordered by the server's preference (the list's order), then the offer's; audio keeps
the offer's order. Each kept video codec carries the fmtp its answer gives
(:attr:`SectionPlan.answer_params`). Other sections are rejected (port 0 in the answer).
More than one sending audio or video section is a 422 ``too_many_tracks`` (WHIP ingests
one stream: one audio + one video); no accepted section at all is a 422
``nothing_receivable``.
"""

from __future__ import annotations

from collections.abc import Sequence

from whip.sdp.codec_rules import (
    H264_PROFILE_IDCS,
    VIDEO_CODEC_NAMES,
    Params,
    VideoCodecName,
    video_answer,
    video_format,
)
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
from whip.sdp.simulcast import offered_simulcast

CONTENT_TYPE = "application/sdp"
RECEIVABLE_PROTOS = frozenset({"UDP/TLS/RTP/SAVPF", "RTP/SAVPF"})
H264_PROFILES = H264_PROFILE_IDCS
DEFAULT_VIDEO_CODECS: tuple[VideoCodecName, ...] = VIDEO_CODEC_NAMES
"""``pipeline.video_codecs``' default: H.264 first (every encoder has it and it is the
cheapest to decode of the efficient formats), then H.265 and AV1 (the best quality per
bit for a publisher's uplink; OBS offers only the one its user picked), VP9, and VP8
(the least efficient) last."""


def receivable(kind: str, codec: Codec, video_codecs: Sequence[str] = DEFAULT_VIDEO_CODECS) -> bool:
    """Whether the pipeline can decode ``codec`` in a section of ``kind`` (module rules),
    with ``video_codecs`` the video formats the server takes."""
    if kind == "video":
        return video_format(codec) in video_codecs and video_answer(codec) is not None
    if kind == "audio" and codec.encoding == "opus":
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
    elif codec.params and video_format(codec) is not None:
        text += " " + ";".join(f"{k}={v}" for k, v in codec.params)
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


def _plan(section: MediaSection, video_codecs: Sequence[str]) -> SectionPlan:
    base = (section.index, section.kind, section.mid)
    reason = _rejection(section)
    if reason is not None:
        return SectionPlan(*base, False, reason=reason)
    kept = [c for c in section.codecs if receivable(section.kind, c, video_codecs)]
    if not kept:
        offered = ", ".join(map(_describe, section.codecs)) or "none"
        return SectionPlan(*base, False, reason=f"no receivable codec (offered: {offered})")
    answers: tuple[Params, ...] = ()
    if section.kind == "video":
        kept.sort(key=lambda c: video_codecs.index(video_format(c) or ""))  # stable
        answers = tuple(video_answer(c) or () for c in kept)
    pts = tuple(c.payload_type for c in kept)
    rtx = tuple(c.payload_type for c in section.codecs if _rtx_for(c, set(pts)))
    return SectionPlan(*base, True, pts, rtx, tuple(kept), answer_params=answers)


def plan_offer(
    offer: SessionDescription, video_codecs: Sequence[str] = DEFAULT_VIDEO_CODECS
) -> OfferSummary:
    """Decide per section what the answer accepts (module rules), taking the video
    formats of ``video_codecs`` in that order of preference. Raises 422 errors."""
    for kind in ("audio", "video"):
        sending = [s for s in offer.media if s.kind == kind and _rejection(s) is None]
        if len(sending) > 1:
            where = ", ".join(f"line {s.line}" for s in sending)
            raise TooManyTracksError(
                f"{len(sending)} sending {kind} sections ({where}); one allowed"
            )
    summary = OfferSummary(tuple(_plan(s, video_codecs) for s in offer.media), offer.bundle)
    if not summary.accepted:
        why = "; ".join(f"section {p.index} ({p.kind}): {p.reason}" for p in summary.sections)
        raise NothingReceivableError(f"nothing receivable in the offer: {why}")
    return summary


def check_offer(
    data: bytes,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    video_codecs: Sequence[str] = DEFAULT_VIDEO_CODECS,
) -> OfferSummary:
    """Parse and plan an offer body. Raises only :class:`SdpError` subclasses (a bad
    simulcast description too: :func:`whip.sdp.simulcast.offered_simulcast`)."""
    summary = plan_offer(parse_offer(data, max_bytes=max_bytes), video_codecs)
    offered_simulcast(data.decode("utf-8"))
    return summary


def check_content_type(value: str | None) -> None:
    """415 unless the Content-Type is ``application/sdp`` (parameters ignored)."""
    if (value or "").split(";")[0].strip().lower() != CONTENT_TYPE:
        raise UnsupportedMediaTypeError(f"Content-Type must be {CONTENT_TYPE}, got {value!r}")
