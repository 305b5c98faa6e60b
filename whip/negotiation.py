"""Negotiation: one peer connection for one offer, every aiortc patch applied in order.

:meth:`Negotiator.negotiate` is step 2's "negotiate" of the session transaction
(ARCHITECTURE.md "Flow of one push"): it makes the peer connection (through the injected
factory, :func:`whip.rtc.peer.new_peer_connection` by default), applies the remote offer,
taps every receiver and returns one :class:`Negotiated`: the peer, its liveness, the
answer SDP, the track intakes and where tap failures go. On any failure it closes the
peer it made and raises; nothing else was taken.

The order of the aiortc patches is required, and is this:

1. :func:`whip.rtc.certificate.use_wide_certificate`: before any transceiver exists (the
   DTLS transports copy the certificate list when they are made).
2. ``setRemoteDescription`` (creates the transceivers; an offer aiortc refuses is
   :class:`whip.sdp.UnprocessableOfferError`, 422).
3. Per transceiver, :func:`whip.rtc.transceiver_codecs.restrict_codecs` (after the
   transceivers exist, before ``createAnswer`` reads their codecs), then the direction,
   then :func:`whip.rtc.tap.install_tap` (before the receiver starts, which is after
   DTLS connects; the tap guards the receiver and its transport against hostile RTP).
4. :func:`whip.rtc.dtls_kick.install_dtls_kick`: after ``setRemoteDescription`` (the
   transports exist), before ICE can connect.
5. :func:`whip.rtc.liveness.install_media_liveness`: before ``setLocalDescription``
   (ICE starts its consent checks as soon as it connects).
6. ``createAnswer`` and ``setLocalDescription`` (ICE gathering), then
   :func:`whip.sdp.finalize_answer`.

Tap failures before the session exists: a tap reports through ``on_error`` from aiortc's
own tasks, possibly before the transaction has a session to fault. :class:`TapFaults`
holds such failures until the transaction routes them (:meth:`TapFaults.route_to`,
right after the session is live), then forwards every later one at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import OperationError

from pipeline.intake import FrameIntake
from whip.config import Config
from whip.rtc.certificate import use_wide_certificate
from whip.rtc.dtls_kick import install_dtls_kick
from whip.rtc.liveness import Liveness, install_media_liveness
from whip.rtc.peer import close_quietly, new_peer_connection
from whip.rtc.pli import schedule_pli
from whip.rtc.tap import install_tap
from whip.rtc.transceiver_codecs import restrict_codecs
from whip.sdp import OfferSummary, UnprocessableOfferError, finalize_answer

logger = logging.getLogger(__name__)

PeerConnectionFactory = Callable[[], RTCPeerConnection]


class TapFaults:
    """Where the taps of one negotiation report failures (module doc). Loop thread."""

    def __init__(self) -> None:
        self._held: list[BaseException] = []
        self._handler: Callable[[BaseException], None] | None = None

    def report(self, exc: BaseException) -> None:
        """A tap did not take effect or its sink failed."""
        if self._handler is None:
            self._held.append(exc)
        else:
            self._handler(exc)

    def route_to(self, handler: Callable[[BaseException], None]) -> None:
        """Send what was held, and from now on every failure, to ``handler``."""
        self._handler = handler
        held, self._held = self._held, []
        for exc in held:
            handler(exc)


@dataclass(slots=True)
class Negotiated:
    """What one negotiation made (module doc)."""

    pc: RTCPeerConnection
    liveness: Liveness
    answer_sdp: str
    intakes: list[FrameIntake] = field(default_factory=list)
    tap_faults: TapFaults = field(default_factory=TapFaults)


def _discard(codec: object, frame: object) -> None:
    """Sink of a tapped track nobody decodes."""


class Negotiator:
    """Negotiates offers for the session transaction (module doc)."""

    def __init__(
        self, config: Config, *, peer_factory: PeerConnectionFactory = new_peer_connection
    ) -> None:
        self.config = config
        self.peer_factory = peer_factory

    async def negotiate(self, offer_sdp: str, summary: OfferSummary, label: str) -> Negotiated:
        """Answer ``offer_sdp`` (already checked into ``summary``); ``label`` names the
        session in logs and intake names.

        Cancellation: the peer connection is closed and nothing is left behind.
        """
        pc = self.peer_factory()
        try:
            self.prepare_certificate(pc)
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            except (ValueError, OperationError) as exc:
                # aiortc refuses some offers check_offer accepts: it wants rtcp-mux, ICE
                # credentials and a codec it knows on every m= section, rejected ones too.
                logger.warning("session %s: offer refused by aiortc: %r", label, exc)
                raise UnprocessableOfferError(f"offer refused by the WebRTC stack: {exc}") from exc
            tap_faults = TapFaults()
            intakes: list[FrameIntake] = []
            for transceiver in pc.getTransceivers():
                receiving = restrict_codecs(transceiver, summary)
                transceiver.direction = "recvonly" if receiving else "inactive"
                intake = self._tap(transceiver, tap_faults, label, receiving=receiving)
                if intake is not None:
                    intakes.append(intake)
            install_dtls_kick(pc)
            liveness = install_media_liveness(pc, self.config.limits.reclaim_after_s)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
            sdp = finalize_answer(pc.localDescription.sdp, summary, self.config.server.public_hosts)
        except BaseException:
            await close_quietly(pc, f"session {label}: negotiation failed")
            raise
        return Negotiated(pc, liveness, sdp, intakes, tap_faults)

    def prepare_certificate(self, pc: RTCPeerConnection) -> None:
        """Step 1: :func:`whip.rtc.certificate.use_wide_certificate`. A method so a fault
        injection test can keep aiortc's stock certificate in a subclass."""
        use_wide_certificate(pc)

    def _tap(
        self, transceiver: Any, faults: TapFaults, label: str, *, receiving: bool
    ) -> FrameIntake | None:
        """Route one receiver's encoded frames into a bounded intake (never to aiortc's
        own decoder thread, whose queue is unbounded). An undecoded track is tapped too,
        into nothing: untapped, aiortc would decode it and grow memory without bound. So
        is a section the answer rejects (``receiving`` False: aiortc never starts its
        receiver), which still guards the transport it shares and gets no intake."""
        pipeline = self.config.pipeline
        receiver = transceiver.receiver
        if not receiving or (transceiver.kind == "audio" and not pipeline.analyze_audio):
            install_tap(receiver, _discard, on_error=faults.report)
            return None
        intake = FrameIntake(
            transceiver.kind,
            depth=pipeline.queue_depth,
            payload_limit=pipeline.payload_limit_bytes,
            on_need_keyframe=schedule_pli(receiver),
            label=f"{label} {transceiver.kind}",
        )
        install_tap(receiver, intake.offer, on_end=intake.close, on_error=faults.report)
        return intake
