"""Congestion control for one peer connection: transport-wide feedback, or REMB, and the ceiling.

:func:`install_congestion_control` decides per session, from the offer:

- **transport-cc** (Chromium, and every libwebrtc-based publisher): when a receiving section
  offers the transport-wide sequence number header extension and ``rtcp-fb transport-cc``
  on a codec we keep, the answer takes both (aiortc knows the extension for parsing but
  never answers it), every RTP packet's sequence number and arrival go into a
  :class:`whip.rtc.twcc.FeedbackRecorder` per DTLS transport, and feedback packets go out
  every :data:`FEEDBACK_INTERVAL_S` while the transport is connected (libwebrtc receivers
  send every 50 ms at these rates). aiortc's own receive-side estimator is switched off on
  those receivers: its REMB (about 500 kb/s for 720p) would cap Chromium's estimate, since
  libwebrtc takes the lower of its own estimate and any REMB it receives.
- **REMB** (aiortc, and any publisher that offers no transport-cc): aiortc's estimator
  stays, as before.
- **The ceiling** ``pipeline.max_bitrate_bps`` (0: none): with transport-cc a REMB of that
  value every :data:`CEILING_INTERVAL_S`; with REMB, aiortc's estimates are capped at it.
  The answer's ``b=AS``/``b=TIAS`` lines are :func:`whip.sdp.congestion.announce_ceiling`'s.

Arrival times: the time each datagram entered aioice (:mod:`whip.rtc.arrival_stamps`), not
the time the router got to it: the wait in aioice's receive queue between the two is
milliseconds under load, which the sender's delay-based estimator would read as queueing.

Threads and cost: everything runs on the event loop thread. Per RTP packet: one attribute
read, one stamp taken (or a clock read) and one :meth:`FeedbackRecorder.record`
(``bench/twcc.py`` measures it); per datagram, one clock read when aioice queues it.
Task ownership: one feedback task per DTLS transport, started when that transport
connects and cancelled when it closes or fails (``statechange``); a send to a transport
that is going away is dropped (aiortc raises ``ConnectionError``), never retried.

aiortc private names touched (:func:`internals_problems` verifies each):

- ``RTCRtpTransceiver._headerExtensions`` and ``._codecs`` (what ``createAnswer`` writes:
  ``a=extmap`` and ``a=rtcp-fb`` lines, and the receive parameters that configure the DTLS
  transport's header extension map), ``._get_mline_index()``
- ``RTCDtlsTransport._rtp_router.route_rtp`` (shadowed per instance, after
  :mod:`whip.rtc.rtp_guard`'s) and ``._send_rtp(data)`` (SRTCP-protects an RTCP packet)
- ``RTCRtpReceiver.__remote_bitrate_estimator`` (set to None, or wrapped) and
  ``.__rtcp_ssrc`` (the feedback's sender SSRC)
- ours: ``_whip_ingest_congestion`` on each receiver of a transport-cc session
  (:func:`congestion_figures` reads it)
- ``aiortc.rtp.HeaderExtensionsMap`` parses :data:`whip.rtc.twcc.TRANSPORT_CC_URI` into
  ``transport_sequence_number``
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiortc.rtcdtlstransport
import aiortc.rtcpeerconnection
import aiortc.rtcrtpreceiver
import aiortc.rtp
from aiortc import RTCPeerConnection
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpHeaderExtensionParameters
from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, pack_remb_fci

from whip.rtc.arrival_stamps import StampedQueue, stamp_arrivals
from whip.rtc.source_text import source_text
from whip.rtc.twcc import TRANSPORT_CC_URI, FeedbackRecorder
from whip.sdp.congestion import offered_transport_cc

logger = logging.getLogger(__name__)

FEEDBACK_INTERVAL_S = 0.05
"""How often a connected transport sends what arrived since the last feedback."""
CEILING_INTERVAL_S = 1.0
"""How often the ceiling REMB is repeated for a transport-cc session."""
MAX_REMB_SSRCS = 16
"""SSRCs named in a ceiling REMB (the sender's media SSRCs; more is a hostile sender)."""

_ESTIMATOR = "_RTCRtpReceiver__remote_bitrate_estimator"
_MARK = "_whip_ingest_congestion"
"""Ours, on every receiver of a transport-cc session: its :class:`TransportFeedback`."""
_RTCP_SSRC = "_RTCRtpReceiver__rtcp_ssrc"


@dataclass(slots=True)
class TransportFeedback:
    """Transport-wide feedback of one DTLS transport (module doc). Loop thread only."""

    transport: Any
    receivers: list[Any]
    max_bitrate_bps: int
    interval_s: float = FEEDBACK_INTERVAL_S
    label: str = ""
    """Names the session in log lines."""
    stamps: StampedQueue | None = None
    """Where the transport's datagrams were stamped on entry (:mod:`whip.rtc.arrival_stamps`)."""
    recorder: FeedbackRecorder = field(default_factory=FeedbackRecorder)
    media_ssrcs: list[int] = field(default_factory=list)
    """SSRCs seen with a transport-wide sequence number, first seen first."""
    feedback_packets: int = 0
    feedback_bytes: int = 0
    ceiling_rembs: int = 0
    send_failures: int = 0
    task: asyncio.Task[None] | None = None

    def note_arrival(self, sequence_number: int, ssrc: int) -> None:
        """One RTP packet carrying ``sequence_number`` is routed now (the router hook): its
        arrival is the time its datagram entered aioice, or now when that is unknown."""
        arrival = self.stamps.take_arrival() if self.stamps is not None else None
        if arrival is None:
            arrival = time.monotonic_ns() // 1000
        self.recorder.record(sequence_number, arrival)
        ssrcs = self.media_ssrcs
        if ssrc not in ssrcs and len(ssrcs) < MAX_REMB_SSRCS:
            ssrcs.append(ssrc)

    def sender_ssrc(self) -> int:
        for receiver in self.receivers:
            ssrc = getattr(receiver, _RTCP_SSRC, None)
            if ssrc is not None:
                return int(ssrc)
        return 1

    async def send_feedback(self) -> int:
        """Build and send what arrived since the last call; returns the packets sent.

        Cancellation: packets already handed to the transport stay sent.
        """
        if not self.media_ssrcs or not self.recorder.pending:
            return 0
        # The media SSRC must be one the sender sends: libwebrtc drops transport feedback
        # naming an SSRC it does not know. The latest one is as good as any.
        packets = self.recorder.build(self.sender_ssrc(), self.media_ssrcs[-1])
        for packet in packets:
            if not await self._send(packet):
                return 0
            self.feedback_packets += 1
            self.feedback_bytes += len(packet)
        return len(packets)

    async def send_ceiling(self) -> bool:
        """Send one REMB of ``max_bitrate_bps`` (a transport-cc sender takes it as a cap)."""
        if self.max_bitrate_bps <= 0 or not self.media_ssrcs:
            return False
        remb = RtcpPsfbPacket(
            fmt=RTCP_PSFB_APP,
            ssrc=self.sender_ssrc(),
            media_ssrc=0,
            fci=pack_remb_fci(self.max_bitrate_bps, list(self.media_ssrcs)),
        )
        sent = await self._send(bytes(remb))
        self.ceiling_rembs += sent
        return sent

    async def _send(self, data: bytes) -> bool:
        try:
            await self.transport._send_rtp(data)
        except ConnectionError:
            self.send_failures += 1
            return False
        return True

    async def run(self) -> None:
        """Feedback every ``interval_s``, the ceiling every :data:`CEILING_INTERVAL_S`,
        until cancelled (module doc). Cancellation: ends at once."""
        loop = asyncio.get_running_loop()
        next_ceiling = loop.time()
        while True:
            await asyncio.sleep(self.interval_s)
            await self.send_feedback()
            if self.max_bitrate_bps > 0 and loop.time() >= next_ceiling and self.media_ssrcs:
                await self.send_ceiling()
                next_ceiling = loop.time() + CEILING_INTERVAL_S

    def on_state(self) -> None:
        """The transport's ``statechange``: start the task when connected, stop it when
        closed or failed."""
        state = self.transport.state
        if state == "connected" and self.task is None:
            self.task = asyncio.get_running_loop().create_task(
                self.run(), name="whip-transport-cc-feedback"
            )
        elif state in ("closed", "failed") and self.task is not None:
            self.task.cancel()
            counts = self.recorder.counts
            logger.info(
                "session %s: transport-cc ended: %d feedback packets (%d bytes) for %d "
                "arrivals (%d duplicate, %d too late), %d ceiling REMBs, %d sends failed",
                self.label,
                self.feedback_packets,
                self.feedback_bytes,
                counts.recorded,
                counts.duplicates,
                counts.too_late,
                self.ceiling_rembs,
                self.send_failures,
            )


class _CappedEstimator:
    """aiortc's receive-side estimator with every REMB it makes capped at a ceiling."""

    __slots__ = ("_cap", "_inner")

    def __init__(self, inner: Any, cap: int) -> None:
        self._inner = inner
        self._cap = cap

    def add(self, **packet: Any) -> tuple[int, list[int]] | None:
        found = self._inner.add(**packet)
        if found is None:
            return None
        bitrate, ssrcs = found
        return min(int(bitrate), self._cap), ssrcs


@dataclass(slots=True)
class CongestionControl:
    """What :func:`install_congestion_control` set up for one peer connection."""

    mode: str
    """``transport-cc`` or ``remb``."""
    max_bitrate_bps: int
    feedback: list[TransportFeedback] = field(default_factory=list)


def install_congestion_control(
    pc: RTCPeerConnection,
    offer_sdp: str,
    max_bitrate_bps: int = 0,
    *,
    transport_cc: bool = True,
    interval_s: float = FEEDBACK_INTERVAL_S,
    label: str = "",
) -> CongestionControl:
    """Set up congestion feedback for ``pc`` (module doc).

    Call on the event loop thread after ``setRemoteDescription`` and the codec trim
    (:func:`whip.rtc.transceiver_codecs.restrict_codecs`), after the taps (the router hook
    goes over :mod:`whip.rtc.rtp_guard`'s), and before ``createAnswer``. Inactive
    transceivers are left alone. ``transport_cc`` False answers REMB to every publisher
    (``pipeline.transport_cc``). ``label`` names the session in log lines.
    """
    offers = offered_transport_cc(offer_sdp) if transport_cc else []
    by_transport: dict[int, TransportFeedback] = {}
    remb_receivers: list[Any] = []
    for transceiver in pc.getTransceivers():
        if transceiver.direction == "inactive":
            continue
        index = transceiver._get_mline_index()
        offer = offers[index] if index is not None and index < len(offers) else None
        kept: set[int] = {c.payloadType for c in transceiver._codecs if c.payloadType is not None}
        if offer is None or offer.extension_id is None or not offer.usable_for(kept):
            remb_receivers.append(transceiver.receiver)
            continue
        transceiver._headerExtensions = [
            *(e for e in transceiver._headerExtensions if e.uri != TRANSPORT_CC_URI),
            RTCRtpHeaderExtensionParameters(id=offer.extension_id, uri=TRANSPORT_CC_URI),
        ]
        for codec in transceiver._codecs:
            if codec.payloadType in offer.feedback_payload_types and not any(
                f.type == "transport-cc" for f in codec.rtcpFeedback
            ):
                codec.rtcpFeedback = [*codec.rtcpFeedback, RTCRtcpFeedback(type="transport-cc")]
        receiver = transceiver.receiver
        setattr(receiver, _ESTIMATOR, None)
        transport = receiver.transport
        feedback = by_transport.get(id(transport))
        if feedback is None:
            feedback = TransportFeedback(transport, [], max_bitrate_bps, interval_s, label)
            feedback.stamps = stamp_arrivals(transport)
            by_transport[id(transport)] = feedback
            hook_router(transport, feedback)
            transport.on("statechange", feedback.on_state)
        feedback.receivers.append(receiver)
        setattr(receiver, _MARK, feedback)
    if max_bitrate_bps > 0:
        for receiver in remb_receivers:
            estimator = getattr(receiver, _ESTIMATOR, None)
            if estimator is not None:
                setattr(receiver, _ESTIMATOR, _CappedEstimator(estimator, max_bitrate_bps))
    mode = "transport-cc" if by_transport else "remb"
    return CongestionControl(mode, max_bitrate_bps, list(by_transport.values()))


def congestion_figures(receivers: Iterable[Any]) -> dict[str, Any]:
    """What ``GET /v1/sessions`` shows of a session's congestion control (its receivers):
    ``mode`` (``transport-cc`` or ``remb``), and for transport-cc the feedback packets and
    bytes sent, the arrivals recorded and the ceiling REMBs sent (each transport once)."""
    found: dict[int, TransportFeedback] = {}
    for receiver in receivers:
        feedback = getattr(receiver, _MARK, None)
        if isinstance(feedback, TransportFeedback):
            found[id(feedback)] = feedback
    if not found:
        return {"mode": "remb"}
    every = list(found.values())
    return {
        "mode": "transport-cc",
        "feedback_packets": sum(f.feedback_packets for f in every),
        "feedback_bytes": sum(f.feedback_bytes for f in every),
        "arrivals": sum(f.recorder.counts.recorded for f in every),
        "ceiling_rembs": sum(f.ceiling_rembs for f in every),
    }


def hook_router(transport: Any, feedback: TransportFeedback) -> None:
    """Record every parsed RTP packet's transport-wide sequence number on ``transport``
    (an ``RTCDtlsTransport``; its router's ``route_rtp``, shadowed per instance)."""
    router = transport._rtp_router
    route = router.route_rtp
    note = feedback.note_arrival

    def route_rtp(packet: aiortc.rtp.RtpPacket) -> Any:
        sequence_number = packet.extensions.transport_sequence_number
        if sequence_number is not None:
            note(sequence_number, packet.ssrc)
        return route(packet)

    router.route_rtp = route_rtp


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    source = source_text

    pc = source(aiortc.rtcpeerconnection)
    need(
        "headerExtensions=transceiver._headerExtensions" in pc,
        "RTCPeerConnection answers and receives transceiver._headerExtensions",
    )
    need("transceiver._codecs" in pc, "RTCPeerConnection answers transceiver._codecs")
    need(
        callable(getattr(aiortc.RTCRtpTransceiver, "_get_mline_index", None)),
        "RTCRtpTransceiver._get_mline_index",
    )
    extensions = aiortc.rtp.HeaderExtensionsMap()
    extensions.configure(
        aiortc.RTCRtpParameters(
            headerExtensions=[RTCRtpHeaderExtensionParameters(id=5, uri=TRANSPORT_CC_URI)]
        )
    )
    parsed = extensions.get(0xBEDE, bytes([0x51, 0x12, 0x34, 0x00]))
    need(parsed.transport_sequence_number == 0x1234, "HeaderExtensionsMap parses transport-cc")
    dtls = aiortc.rtcdtlstransport.RTCDtlsTransport
    need("self._rtp_router = RtpRouter()" in source(dtls.__init__), "RTCDtlsTransport._rtp_router")
    need(
        "self._rtp_router.route_rtp(packet)" in source(dtls._handle_rtp_data),
        "RTCDtlsTransport routes RTP through _rtp_router.route_rtp",
    )
    send = getattr(dtls, "_send_rtp", None)
    need(
        inspect.iscoroutinefunction(send) and "protect_rtcp" in source(send),
        "RTCDtlsTransport._send_rtp protects RTCP",
    )
    receiver = aiortc.rtcrtpreceiver.RTCRtpReceiver
    init = source(receiver.__init__)
    need("self.__remote_bitrate_estimator = " in init, "RTCRtpReceiver.__remote_bitrate_estimator")
    need("self.__rtcp_ssrc" in init, "RTCRtpReceiver.__rtcp_ssrc")
    handle = source(receiver._handle_rtp_packet)
    need(
        "if self.__remote_bitrate_estimator is not None" in handle
        and "self.__remote_bitrate_estimator.add(" in handle,
        "RTCRtpReceiver._handle_rtp_packet feeds __remote_bitrate_estimator",
    )
    return problems
