"""The SDP vocabulary of the WHIP surface: errors, parsed offers, the answer plan.

Pure data (frozen dataclasses); :mod:`whip.sdp.parse` makes descriptions,
:mod:`whip.sdp.offer_policy` plans, :mod:`whip.sdp.answer` writes the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from whip.errors import HttpError


class SdpError(HttpError):
    """The offer is not acceptable SDP (remote fault)."""

    http_status = 400
    code = "bad_sdp"


class SdpTooLargeError(SdpError):
    http_status = 413
    code = "sdp_too_large"


class UnsupportedMediaTypeError(SdpError):
    http_status = 415
    code = "unsupported_media_type"


class UnprocessableOfferError(SdpError):
    """Well-formed SDP this server cannot ingest."""

    http_status = 422
    code = "unprocessable_offer"


class NothingReceivableError(UnprocessableOfferError):
    code = "nothing_receivable"


class TooManyTracksError(UnprocessableOfferError):
    code = "too_many_tracks"


class AnswerMismatchError(HttpError):
    """The media stack's answer does not line up with the offer (local fault)."""

    http_status = 500
    code = "answer_mismatch"


class Direction(StrEnum):
    SENDRECV = "sendrecv"
    SENDONLY = "sendonly"
    RECVONLY = "recvonly"
    INACTIVE = "inactive"


@dataclass(frozen=True, slots=True)
class Codec:
    """One ``a=rtpmap`` (plus its ``a=fmtp`` parameters, in written order)."""

    payload_type: int
    name: str
    clock_rate: int
    channels: int | None = None
    params: tuple[tuple[str, str], ...] = ()

    @property
    def encoding(self) -> str:
        return self.name.lower()

    def param(self, key: str) -> str | None:
        """A format parameter by case-insensitive name."""
        key = key.lower()
        return next((v for k, v in self.params if k.lower() == key), None)


@dataclass(frozen=True, slots=True)
class MediaSection:
    index: int
    line: int
    kind: str
    port: int
    proto: str
    formats: tuple[str, ...]
    direction: Direction
    mid: str | None
    codecs: tuple[Codec, ...]  # in m= line order; formats without rtpmap are left out
    bundle_only: bool
    ice_ufrag: str | None
    ice_pwd: str | None
    fingerprints: tuple[str, ...]
    setup: str | None

    @property
    def active(self) -> bool:
        return self.port != 0 or self.bundle_only


@dataclass(frozen=True, slots=True)
class SessionDescription:
    origin: str
    name: str
    bundle: tuple[str, ...]
    media: tuple[MediaSection, ...]


@dataclass(frozen=True, slots=True)
class SectionPlan:
    """What the answer does with one offered media section."""

    index: int
    kind: str
    mid: str | None
    accepted: bool
    payload_types: tuple[int, ...] = ()  # receivable codecs, in the answer's order
    rtx_payload_types: tuple[int, ...] = ()
    codecs: tuple[Codec, ...] = ()  # the codecs of payload_types
    reason: str | None = None  # why rejected
    answer_params: tuple[tuple[tuple[str, str], ...], ...] = ()
    """Video: the answer's fmtp for each of ``codecs`` (:mod:`whip.sdp.codec_rules`);
    empty for audio (the media stack's own answer stands)."""

    @property
    def chosen(self) -> Codec | None:
        return self.codecs[0] if self.codecs else None


@dataclass(frozen=True, slots=True)
class OfferSummary:
    sections: tuple[SectionPlan, ...]
    bundle: tuple[str, ...]

    @property
    def accepted(self) -> tuple[SectionPlan, ...]:
        return tuple(s for s in self.sections if s.accepted)

    @property
    def audio(self) -> SectionPlan | None:
        return next((s for s in self.accepted if s.kind == "audio"), None)

    @property
    def video(self) -> SectionPlan | None:
        return next((s for s in self.accepted if s.kind == "video"), None)
