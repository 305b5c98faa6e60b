"""What every depacketizer offers: a per-packet step, a frame step, and their counters.

Rules:

- :meth:`Depacketizer.depacketize` takes one RTP payload and returns a
  :class:`DepacketizedPacket`: ``data`` is the packet's fragment elements
  (:mod:`pipeline.rtp_payload.fragments`), plus what frame-boundary logic needs from the
  payload itself. Its result depends on the payload alone (only counters, and VP9's
  latest scalability structure, are kept), so it fits aiortc's stateless
  ``depayload(codec, payload) -> bytes`` (return ``.data``).
- :meth:`Depacketizer.assemble` takes the concatenated ``data`` of one frame's packets
  (aiortc's ``JitterFrame.data``) and returns the decoder's bitstream as an
  :class:`AssembledFrame`, or raises.
- Both raise only :class:`~pipeline.rtp_payload.errors.PayloadError` (a ``ValueError``),
  and count it by reason in ``errors`` before raising; what the format says to discard
  (H.265 PACI, AV1 temporal delimiters and tile lists) is counted in ``dropped``. The
  counters are plain ints in a ``Counter``: one depacketizer belongs to one track and is
  used from one thread (the event loop), so they need no lock.
- Frame boundaries: a packet *can begin* a frame when ``frame_start`` (nothing in it
  continues the previous packet, and for VP9 it is the first layer of a picture); it
  *ends* one when :meth:`DepacketizedPacket.ends_frame` holds for its RTP marker bit. A
  frame whose first packet cannot begin one lost its start; the frame step refuses it
  (``frame_start_missing``) anyway.
- ``keyframe`` on a packet (and ``keyframe_hint`` on a frame) is what the *payload
  format* says (AV1 N bit, VP9 P bit clear on a picture's first packet); H.265 has no
  such flag. The bitstream-level check is :mod:`pipeline.keyframes`: the two are kept
  apart because a payload flag is a sender's claim and the bitstream is the truth.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from pipeline.rtp_payload.errors import PayloadError

DEFAULT_MAX_FRAME_BYTES = 1 << 20
"""1 MiB: the intake's default per-frame payload limit; aiortc's jitter buffer (512
packets of at most 1500 bytes) never hands over more than about 750 KB anyway."""


@dataclass(frozen=True, slots=True)
class DepacketizedPacket:
    """The per-packet step's result."""

    data: bytes
    """Fragment elements: what aiortc stores as ``packet._data``."""
    begins: bool
    """Nothing in this packet continues the previous packet (H.265: not an FU, or an FU
    with S; AV1: Z clear; VP9: B set)."""
    ends: bool
    """Nothing in this packet continues into the next (H.265: not an FU, or an FU with E;
    AV1: Y clear; VP9: E set)."""
    frame_start: bool
    """The packet can be the first of a frame: ``begins``, and for VP9 also the base (or
    only) spatial layer."""
    keyframe: bool
    """The payload format says a keyframe starts here (AV1 N; VP9 P clear with B set on
    the base layer). Always False for H.265."""

    def ends_frame(self, marker: bool) -> bool:
        """This packet, with this RTP marker bit, is the last of its frame."""
        return marker and self.ends


@dataclass(frozen=True, slots=True)
class AssembledFrame:
    """The frame step's result: what the decoder takes."""

    data: bytes
    """H.265: Annex-B; AV1: a low-overhead temporal unit; VP9: a frame or superframe."""
    keyframe_hint: bool
    """The payload format's keyframe flag on the frame's first packet."""


class Depacketizer(ABC):
    """One track's depacketizer (subclasses: one per payload format)."""

    codec: ClassVar[str]
    """The RTP encoding name, as aiortc's ``RTCRtpCodecParameters.name`` spells it."""

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be positive, not {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self.errors: Counter[str] = Counter()
        """Refused packets and frames, by :attr:`PayloadError.reason`."""
        self.dropped: Counter[str] = Counter()
        """Units the format says to discard, by kind (``paci``, ``temporal_delimiter``...)."""
        self.packets = 0
        self.frames = 0

    def depacketize(self, payload: bytes) -> DepacketizedPacket:
        """One RTP payload into fragment elements. Raises :class:`PayloadError`."""
        try:
            packet = self._packet(payload)
        except PayloadError as exc:
            self.errors[exc.reason] += 1
            raise
        self.packets += 1
        return packet

    def assemble(self, data: bytes) -> AssembledFrame:
        """One frame's concatenated elements into the decoder's bitstream. Raises
        :class:`PayloadError`; the result is at most ``max_frame_bytes`` long."""
        try:
            frame = self._frame(data)
        except PayloadError as exc:
            self.errors[exc.reason] += 1
            raise
        if len(frame.data) > self.max_frame_bytes:
            self.errors["frame_too_large"] += 1
            raise PayloadError("frame_too_large", f"{len(frame.data)} bytes")
        self.frames += 1
        return frame

    @abstractmethod
    def _packet(self, payload: bytes) -> DepacketizedPacket:
        """The format's per-packet step."""

    @abstractmethod
    def _frame(self, data: bytes) -> AssembledFrame:
        """The format's frame step."""
