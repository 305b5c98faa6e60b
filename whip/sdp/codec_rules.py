"""Which offered video formats the pipeline decodes, and the fmtp the answer gives each. Pure.

Rules (one function per RTP format; :func:`video_format` dispatches by encoding name):

- H.264 (RFC 6184): ``packetization-mode=1`` only (aiortc's depayloader takes STAP-A and
  FU-A, not the interleaved mode 2). ``profile-level-id`` absent (baseline) or one of
  :data:`H264_PROFILE_IDCS`: every profile FFmpeg's ``h264`` decoder implements in full.
  Left out: Extended (``58``: SP/SI slices and data partitioning, which FFmpeg does not
  decode), the scalable (``53``, ``56``) and multiview (``76``, ``80``) profiles (their
  enhancement layers would be ignored). Any level: what bounds a picture here is
  ``pipeline.max_pixels``, not the level. The answer reflects the offered
  ``profile-level-id`` (RFC 6184 8.2.2: the answerer keeps the offer's profile; a level
  it can take is kept too), ``packetization-mode`` and ``level-asymmetry-allowed``.
- H.265 (RFC 7798): ``profile-space`` 0 and ``profile-id`` 1 (Main), 2 (Main 10) or 3
  (Main Still Picture), the profiles of FFmpeg's ``hevc`` decoder that every build has;
  absent means Main. ``tier-flag`` 0 or 1 and any ``level-id`` (our decoder has no level
  limit). ``tx-mode`` absent or ``SRST`` (one RTP stream: the depacketizer does not
  reorder across streams). ``sprop-max-don-diff`` within 0..32767 (DONL is decoded).
  RFC 7798 7.2.2: the answerer keeps ``profile-space``, ``tier-flag``, ``profile-id``,
  ``profile-compatibility-indicator``, ``interop-constraints`` and ``level-id`` as offered
  (``level-id`` may only be lowered, and we never need to), or removes the format; so the
  answer's fmtp is exactly those offered parameters. ``sprop-*`` describe the sender's
  stream and are not answered.
- AV1 (AV1 RTP payload format 7.2): ``profile`` 0 (Main), 1 (High) or 2 (Professional),
  all of which libdav1d decodes; absent means 0. ``level-idx`` 0..31 and ``tier`` 0 or 1,
  any of them (same reason as H.264's level). The answer keeps ``profile``, ``level-idx``
  and ``tier`` as offered: the receiver may not change the profile, and a level it takes
  stays.
- VP9 (RFC 9628 6): ``profile-id`` 0..3 (FFmpeg's ``vp9`` decodes all four); absent
  means 0. The answer keeps ``profile-id`` as offered.
- VP8 (RFC 7741): no parameters to check; the answer has none.

Every format also needs clock rate 90000. A numeric parameter that is not a decimal
number makes the format unreceivable (never an exception).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, get_args

from whip.sdp.model import Codec

VideoCodecName = Literal["h264", "h265", "av1", "vp9", "vp8"]
"""What ``pipeline.video_codecs`` may list: the video formats the pipeline decodes."""
VIDEO_CODEC_NAMES: tuple[VideoCodecName, ...] = get_args(VideoCodecName)

H264_PROFILE_IDCS = frozenset({0x42, 0x4D, 0x64, 0x6E, 0x7A, 0xF4, 0x2C})
"""Baseline family (42), Main (4d), High (64), High 10 (6e), High 4:2:2 (7a), High 4:4:4
Predictive (f4), CAVLC 4:4:4 Intra (2c): the ``profile_idc`` values FFmpeg's ``h264``
decodes in full (constraint flags, e.g. High 10 Intra, do not matter to a decoder)."""
H265_PROFILE_IDS = frozenset({1, 2, 3})
AV1_PROFILES = frozenset({0, 1, 2})
VP9_PROFILE_IDS = frozenset({0, 1, 2, 3})
MAX_DON_DIFF = 32767

_H265_ANSWERED = (
    "profile-space",
    "tier-flag",
    "profile-id",
    "profile-compatibility-indicator",
    "interop-constraints",
    "level-id",
)
_AV1_ANSWERED = ("profile", "level-idx", "tier")
_VP9_ANSWERED = ("profile-id",)
_H264_ANSWERED = ("level-asymmetry-allowed", "packetization-mode", "profile-level-id")

Params = tuple[tuple[str, str], ...]
"""fmtp parameters, in order."""


def _number(codec: Codec, key: str, default: int) -> int | None:
    """The parameter as a non-negative int, ``default`` when absent, None when invalid."""
    raw = codec.param(key)
    if raw is None:
        return default
    return int(raw) if re.fullmatch(r"\d{1,9}", raw.strip()) else None


def _kept(codec: Codec, keys: tuple[str, ...]) -> Params:
    wanted = {k.lower() for k in keys}
    return tuple((k, v) for k, v in codec.params if k.lower() in wanted)


def h264_answer(codec: Codec) -> Params | None:
    """H.264 (module rules): the answer's fmtp, or None when not receivable."""
    if codec.param("packetization-mode") != "1":
        return None
    plid = codec.param("profile-level-id")
    if plid is not None and (
        re.fullmatch(r"[0-9A-Fa-f]{6}", plid) is None or int(plid[:2], 16) not in H264_PROFILE_IDCS
    ):
        return None
    return _kept(codec, _H264_ANSWERED)


def h265_answer(codec: Codec) -> Params | None:
    """H.265 (module rules): the answer's fmtp, or None when not receivable."""
    space = _number(codec, "profile-space", 0)
    profile = _number(codec, "profile-id", 1)
    tier = _number(codec, "tier-flag", 0)
    level = _number(codec, "level-id", 93)
    don_diff = _number(codec, "sprop-max-don-diff", 0)
    mode = (codec.param("tx-mode") or "SRST").strip().upper()
    if (
        space != 0
        or profile not in H265_PROFILE_IDS
        or tier not in (0, 1)
        or level is None
        or level > 255
        or don_diff is None
        or don_diff > MAX_DON_DIFF
        or mode != "SRST"
    ):
        return None
    return _kept(codec, _H265_ANSWERED)


def av1_answer(codec: Codec) -> Params | None:
    """AV1 (module rules): the answer's fmtp, or None when not receivable."""
    profile = _number(codec, "profile", 0)
    level = _number(codec, "level-idx", 5)
    tier = _number(codec, "tier", 0)
    if profile not in AV1_PROFILES or level is None or level > 31 or tier not in (0, 1):
        return None
    return _kept(codec, _AV1_ANSWERED)


def vp9_answer(codec: Codec) -> Params | None:
    """VP9 (module rules): the answer's fmtp, or None when not receivable."""
    if _number(codec, "profile-id", 0) not in VP9_PROFILE_IDS:
        return None
    return _kept(codec, _VP9_ANSWERED)


def vp8_answer(codec: Codec) -> Params | None:
    """VP8: always receivable at 90 kHz; no parameters."""
    return ()


_RULES: dict[str, Callable[[Codec], Params | None]] = {
    "h264": h264_answer,
    "h265": h265_answer,
    "av1": av1_answer,
    "vp9": vp9_answer,
    "vp8": vp8_answer,
}


def video_format(codec: Codec) -> VideoCodecName | None:
    """The pipeline's name for an offered video codec (``hevc`` is H.265), or None."""
    name = codec.encoding
    name = "h265" if name == "hevc" else name
    for known in VIDEO_CODEC_NAMES:
        if known == name:
            return known
    return None


def video_answer(codec: Codec) -> Params | None:
    """The answer's fmtp for an offered video codec the pipeline decodes, or None when
    it is not receivable (module rules)."""
    name = video_format(codec)
    if name is None or codec.clock_rate != 90000:
        return None
    return _RULES[name](codec)
