"""What the publisher's SDP offer said the video would be: the codec's fmtp, read into
the names :mod:`pipeline.stream_profile` uses (sans-IO, pure).

Rules:

- Input is the negotiated codec's format parameters as a mapping (aiortc's
  ``RTCRtpCodecParameters.parameters``: the offer's ``a=fmtp`` keys; values may be
  strings or ints). :func:`read_offered_profile` never raises: a malformed value reads
  as not stated (None), and so does an absent one. The RFCs' defaults for absent
  parameters (RFC 6184's baseline level 1, RFC 7798's Main 3.1) are deliberately not
  applied: a publisher that states nothing is not warned about a disagreement.
- H.264 (RFC 6184 8.1): ``profile-level-id``, six hex digits: profile_idc,
  profile-iop (the constraint flags byte), level_idc.
- H.265 (RFC 7798 7.1): ``profile-id``, ``tier-flag``, ``level-id``
  (``general_level_idc``).
- AV1 (AV1 RTP payload format 7.2.1): ``profile``, ``level-idx``, ``tier``.
- VP9 (RFC 9628 6): ``profile-id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.stream_profile import (
    AV1_PROFILES,
    H265_PROFILES,
    av1_level_name,
    h264_level_name,
    h264_profile_name,
    h265_level_name,
)


@dataclass(frozen=True, slots=True)
class OfferedProfile:
    """Profile, level and tier as the offer's fmtp stated them (None: not stated)."""

    profile: str | None
    level: str | None
    tier: str | None


def read_offered_profile(codec: str, fmtp: Mapping[str, object] | None) -> OfferedProfile | None:
    """The :class:`OfferedProfile` of ``codec``'s fmtp, or None when it states nothing
    this module reads (module doc)."""
    if not fmtp:
        return None
    name = codec.upper()
    offered: OfferedProfile | None = None
    if name == "H264":
        offered = _h264(fmtp)
    elif name in ("H265", "HEVC"):
        profile_id = _int(fmtp.get("profile-id"))
        level_id = _int(fmtp.get("level-id"))
        tier = _int(fmtp.get("tier-flag"))
        offered = OfferedProfile(
            None if profile_id is None else H265_PROFILES.get(profile_id, f"profile-{profile_id}"),
            None if level_id is None else h265_level_name(level_id),
            None if tier is None else ("high" if tier else "main"),
        )
    elif name == "AV1":
        profile = _int(fmtp.get("profile"))
        level_idx = _int(fmtp.get("level-idx"))
        tier = _int(fmtp.get("tier"))
        offered = OfferedProfile(
            None if profile is None else AV1_PROFILES.get(profile, f"profile-{profile}"),
            None if level_idx is None or level_idx > 31 else av1_level_name(level_idx),
            None if tier is None else ("high" if tier else "main"),
        )
    elif name == "VP9":
        profile_id = _int(fmtp.get("profile-id"))
        offered = OfferedProfile(
            None if profile_id is None else f"profile-{profile_id}", None, None
        )
    if offered is None or offered == OfferedProfile(None, None, None):
        return None
    return offered


def _h264(fmtp: Mapping[str, object]) -> OfferedProfile | None:
    value = fmtp.get("profile-level-id")
    text = str(value) if value is not None else ""
    if len(text) != 6:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    profile_idc, constraints, level_idc = raw
    return OfferedProfile(
        h264_profile_name(profile_idc, constraints),
        h264_level_name(level_idc, constraints, profile_idc),
        None,
    )


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 256 else None
    if isinstance(value, str) and value.isdecimal() and len(value) <= 3:
        return int(value)
    return None
