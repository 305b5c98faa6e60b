"""Negotiation: one peer connection for one offer, every aiortc patch applied in order.

:meth:`Negotiator.negotiate` is step 2's "negotiate" of the session transaction
(ARCHITECTURE.md "Flow of one push"): it makes the peer connection (through the injected
factory, :func:`whip.rtc.peer.new_peer_connection` by default), applies the remote offer,
taps every receiver and returns one :class:`Negotiated`: the peer, its liveness, the
answer SDP, how the peer ends, the track intakes and where tap failures go. On any
failure it closes the peer it made and raises; nothing else was taken.

The order of the aiortc patches is required, and is this:

1. :func:`whip.rtc.certificate.use_wide_certificate`: before any transceiver exists (the
   DTLS transports copy the certificate list when they are made).
2. ``setRemoteDescription`` (creates the transceivers; an offer aiortc refuses is
   :class:`whip.sdp.UnprocessableOfferError`, 422).
3. Per transceiver, :func:`whip.rtc.transceiver_codecs.restrict_codecs` (after the
   transceivers exist, before ``createAnswer`` reads their codecs), then the direction,
   then :func:`whip.rtc.tap.install_tap` (before the receiver starts, which is after
   DTLS connects; the tap guards the receiver and its transport against hostile RTP).
3a. For every decoded receiver, with step 3's ``install_tap``: a
   :class:`whip.rtc.depayload.PayloadFormats` from the plan's offered fmtp, given to
   ``install_tap`` (when aiortc calls ``receive()`` it binds a depacketizer to each
   H.265, AV1 or VP9 codec) and in front of the intake (``framing``: the frame step).
   aiortc's ``depayload`` and codec table were replaced once, process-wide, by
   ``create_app`` (:mod:`whip.rtc.depayload`, :mod:`whip.rtc.codec_table`).
3b. :func:`whip.rtc.congestion.install_congestion_control`: after the codecs are trimmed
   (it reads the kept codecs' feedback), before ``createAnswer`` (the answer carries the
   transport-cc extension and feedback it adds).
3c. For a video section offering simulcast, after the tap,
   :func:`whip.rtc.simulcast.install_simulcast` (the demux wraps the guarded handler;
   before ``createAnswer``: it adds the RID header extensions the answer carries) and,
   for ``pipeline.simulcast = "all"``, an intake per further layer.
4. :func:`whip.rtc.dtls_kick.install_dtls_kick`: after ``setRemoteDescription`` (the
   transports exist), before ICE can connect. Then the ICE sockets, both before
   ``setLocalDescription`` gathers (after ``setRemoteDescription``: the ICE connections
   exist and BUNDLE has dropped the extra ones):
   :func:`whip.rtc.ice_sockets.use_ice_sockets` (when the negotiator has
   ``ice_sockets``) marks the server's connections for the shared UDP port or the
   per-session sockets (publishers in the same process keep aioice's own sockets) and
   gives them their long ufrag; then, when ICE-TCP is on,
   :func:`whip.rtc.ice_tcp.install_ice_tcp` (it registers the session with the TCP port
   when it gathers, with that ufrag, and adds the passive candidates).
5. :func:`whip.rtc.liveness.install_media_liveness`: before ``setLocalDescription``
   (ICE starts its consent checks as soon as it connects); then
   :func:`whip.rtc.peer_end.watch_peer_end` (after ``setRemoteDescription``: the DTLS
   transports and receivers exist; before DTLS can connect).
6. ``createAnswer`` and ``setLocalDescription`` (ICE gathering: the sockets of step 4),
   then :func:`whip.sdp.finalize_answer`, then :mod:`whip.sdp.congestion`'s ceiling and
   start bitrate (the latter for a libwebrtc offer only, at most the ceiling), then
   :func:`whip.sdp.simulcast.answer_simulcast` (every offered RID).

Tap failures before the session exists: a tap reports through ``on_error`` from aiortc's
own tasks, possibly before the transaction has a session to fault. :class:`TapFaults`
holds such failures until the transaction routes them (:meth:`TapFaults.route_to`,
right after the session is live), then forwards every later one at once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import OperationError

from pipeline.intake import FrameIntake
from whip.config import Config
from whip.rtc.certificate import use_wide_certificate
from whip.rtc.congestion import CongestionControl, install_congestion_control
from whip.rtc.depayload import PayloadFormats
from whip.rtc.dtls_kick import install_dtls_kick
from whip.rtc.ice_sockets import IceSocketProvider, use_ice_sockets
from whip.rtc.ice_tcp import IceTcpListener, install_ice_tcp
from whip.rtc.liveness import Liveness, install_media_liveness
from whip.rtc.peer import close_quietly, new_peer_connection
from whip.rtc.peer_end import PeerEnd, watch_peer_end
from whip.rtc.pli import PliPacer, schedule_pli
from whip.rtc.simulcast import SimulcastDemux, install_simulcast
from whip.rtc.tap import install_tap
from whip.rtc.transceiver_codecs import plan_of, restrict_codecs
from whip.sdp import OfferSummary, UnprocessableOfferError, finalize_answer
from whip.sdp.congestion import (
    announce_ceiling,
    announce_start_bitrate,
    offers_transport_cc_video,
)
from whip.sdp.simulcast import (
    SimulcastOffer,
    answer_simulcast,
    offered_simulcast,
    simulcast_mode,
)

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
    peer_end: PeerEnd = field(default_factory=PeerEnd)
    intakes: list[FrameIntake] = field(default_factory=list)
    tap_faults: TapFaults = field(default_factory=TapFaults)
    congestion: CongestionControl | None = None
    simulcast: list[SimulcastDemux] = field(default_factory=list)
    receivers: dict[FrameIntake, Any] = field(default_factory=dict)
    """The aiortc receiver each tapped intake is fed by (a layer intake has none)."""


def _discard(codec: object, frame: object) -> None:
    """Sink of a tapped track nobody decodes."""


class Negotiator:
    """Negotiates offers for the session transaction (module doc)."""

    def __init__(
        self, config: Config, *, peer_factory: PeerConnectionFactory = new_peer_connection
    ) -> None:
        self.config = config
        self.peer_factory = peer_factory
        self.ice_tcp: IceTcpListener | None = None
        """The ICE-TCP port the sessions register with (set by the session manager)."""
        self.ice_sockets: IceSocketProvider | None = None
        """Where the server's ICE connections gather (set by the session manager from
        the app's sockets); ``None``: aioice's own sockets."""

    async def negotiate(self, offer_sdp: str, summary: OfferSummary, label: str) -> Negotiated:
        """Answer ``offer_sdp`` (already checked into ``summary``); ``label`` names the
        session in logs and intake names.

        Cancellation: the peer connection is closed and nothing is left behind.
        """
        simulcast_offers = offered_simulcast(offer_sdp)
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
            receivers: dict[FrameIntake, Any] = {}
            demuxes: list[SimulcastDemux] = []
            answered: dict[int, SimulcastOffer] = {}
            for transceiver in pc.getTransceivers():
                receiving = restrict_codecs(transceiver, summary)
                transceiver.direction = "recvonly" if receiving else "inactive"
                intake = self._tap(transceiver, summary, tap_faults, label, receiving=receiving)
                if intake is not None:
                    intakes.append(intake)
                    receivers[intake] = transceiver.receiver
                index = transceiver._get_mline_index()
                offer = simulcast_offers.get(index) if index is not None else None
                if receiving and offer is not None and transceiver.kind == "video":
                    plan = plan_of(transceiver, summary)
                    codec = plan.chosen.encoding if plan and plan.chosen else None
                    mode = simulcast_mode(self.config.pipeline.simulcast, codec)
                    if mode != self.config.pipeline.simulcast:
                        logger.warning(
                            "session %s: simulcast %s decodes the highest layer only for %s",
                            label,
                            self.config.pipeline.simulcast,
                            codec,
                        )
                    demux = install_simulcast(transceiver, offer, mode, label)
                    demuxes.append(demux)
                    answered[offer.index] = offer
                    if mode == "all" and intake is not None:
                        intakes.extend(self._layer_intakes(demux, offer, intake, label))
            ceiling = self.config.pipeline.max_bitrate_bps
            congestion = install_congestion_control(
                pc,
                offer_sdp,
                ceiling,
                transport_cc=self.config.pipeline.transport_cc,
                label=label,
            )
            install_dtls_kick(pc)
            if self.ice_sockets is not None:
                use_ice_sockets(pc, self.ice_sockets)
            if self.ice_tcp is not None:
                install_ice_tcp(pc, self.ice_tcp, label)
            liveness = install_media_liveness(pc, self.config.limits.reclaim_after_s)
            peer_end = watch_peer_end(pc, label)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
            sdp = finalize_answer(pc.localDescription.sdp, summary, self.config.server.public_hosts)
            sdp = announce_ceiling(sdp, ceiling)
            if offers_transport_cc_video(offer_sdp):  # a libwebrtc publisher
                start = self.config.pipeline.start_bitrate_bps
                sdp = announce_start_bitrate(sdp, min(start, ceiling) if ceiling else start)
            sdp = answer_simulcast(sdp, answered)
        except BaseException:
            await close_quietly(pc, f"session {label}: negotiation failed")
            raise
        logger.info("session %s: congestion control %s", label, congestion.mode)
        return Negotiated(
            pc, liveness, sdp, peer_end, intakes, tap_faults, congestion, demuxes, receivers
        )

    def prepare_certificate(self, pc: RTCPeerConnection) -> None:
        """Step 1: :func:`whip.rtc.certificate.use_wide_certificate`. A method so a fault
        injection test can keep aiortc's stock certificate in a subclass."""
        use_wide_certificate(pc)

    def _layer_intakes(
        self, demux: SimulcastDemux, offer: SimulcastOffer, first: FrameIntake, label: str
    ) -> list[FrameIntake]:
        """``pipeline.simulcast = "all"``: the tapped intake takes the first RID, every
        other RID gets its own intake (a decode worker each, reserved by the session
        manager); a layer's keyframe requests go to that layer's SSRC. The extra intakes
        close with the supervisor (the tap's end-of-stream closes only the first)."""
        pipeline = self.config.pipeline
        sinks: dict[str, Callable[[Any, Any], object]] = {offer.rids[0]: first.offer}
        extra: list[FrameIntake] = []
        for rid in offer.rids[1:]:
            intake = FrameIntake(
                "video",
                depth=pipeline.queue_depth,
                payload_limit=pipeline.payload_limit_bytes,
                on_need_keyframe=PliPacer(functools.partial(demux.send_layer_pli, rid)),
                label=f"{label} video {rid}",
                layer=rid,
            )
            sinks[rid] = intake.offer
            extra.append(intake)
        demux.decode_all(sinks)
        return extra

    def _tap(
        self,
        transceiver: Any,
        summary: OfferSummary,
        faults: TapFaults,
        label: str,
        *,
        receiving: bool,
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
        plan = plan_of(transceiver, summary)
        offered_fmtp = {c.payload_type: dict(c.params) for c in (plan.codecs if plan else ())}
        intake = FrameIntake(
            transceiver.kind,
            depth=pipeline.queue_depth,
            payload_limit=pipeline.payload_limit_bytes,
            on_need_keyframe=schedule_pli(receiver),
            label=f"{label} {transceiver.kind}",
            offered_fmtp=offered_fmtp,
        )
        formats = PayloadFormats(
            offered_fmtp,
            max_frame_bytes=pipeline.payload_limit_bytes,
            label=intake.label,
        )
        install_tap(
            receiver,
            formats.framing(intake.offer, intake.frame_lost),
            on_end=intake.close,
            on_error=faults.report,
            formats=formats,
        )
        return intake
