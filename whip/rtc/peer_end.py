"""How a peer ended: cleanly (DTLS close_notify, RTCP BYE) or not at all (it went quiet).

medooze's whip-whep and OBS close their peer connection a moment before they DELETE; an
aiortc publisher's ``pc.close()`` sends an RTCP BYE for each of its sources and then a DTLS
close_notify. aiortc folds every end into one DTLS state, ``closed``: after a close_notify,
after ICE closed under it (consent or media silence) and after our own close alike.
:func:`watch_peer_end` tells them apart:

- close_notify: when a DTLS transport reaches ``closed``, its OpenSSL connection says
  whether a close_notify was received (``get_shutdown() & RECEIVED_SHUTDOWN``);
- RTCP BYE: each receiver's ``_handle_rtcp_packet`` is shadowed per instance to note the
  receivers a BYE reached (only SRTCP that passed unprotect gets there). The peer has said
  goodbye once every receiver that carried media (those in the transport's SSRC table) got
  one.

Either one sets :attr:`PeerEnd.reason` (the first wins) and wakes the listeners; the
session then closes as ``peer_closed``. Nothing here closes anything. Event loop only.

aiortc internals touched (checked by :func:`internals_problems`):
``RTCDtlsTransport._ssl``, ``RTCDtlsTransport._rtp_router.ssrc_table``,
``RTCRtpReceiver._handle_rtcp_packet`` (shadowed per instance); the DTLS transport's
public ``statechange`` event.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiortc.rtcdtlstransport
import aiortc.rtcrtpreceiver
from aiortc import RTCPeerConnection
from aiortc.rtp import RtcpByePacket
from OpenSSL import SSL

from whip.rtc.peer import dtls_transports

logger = logging.getLogger(__name__)

CLOSE_NOTIFY = "close_notify"
RTCP_BYE = "rtcp_bye"


@dataclass(slots=True)
class PeerEnd:
    """Whether the peer ended cleanly, and how (event loop only)."""

    reason: str | None = None
    """:data:`CLOSE_NOTIFY` or :data:`RTCP_BYE` once the peer said goodbye."""
    said_bye: set[int] = field(default_factory=set)
    """``id()`` of the receivers a BYE reached."""
    _listeners: list[Callable[[], None]] = field(default_factory=list)

    def on_end(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments) when the peer ends cleanly."""
        self._listeners.append(listener)

    def ended(self, reason: str) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        logger.info("peer ended cleanly: %s", reason)
        for listener in list(self._listeners):
            listener()


def watch_peer_end(pc: RTCPeerConnection, label: str = "") -> PeerEnd:
    """Watch ``pc``'s DTLS transports and receivers for a clean end (module doc). Call
    after ``setRemoteDescription`` (the transports and receivers exist). ``label`` (the
    session id) starts each log line: a BYE is logged per receiver, since aiortc ends that
    receiver's track on it even while the peer's other tracks go on (GStreamer's
    webrtcbin does that, docs/INTEROP.md section 12)."""
    state = PeerEnd()
    for dtls in dtls_transports(pc):

        def on_state(dtls: Any = dtls) -> None:
            if dtls.state == "closed" and _received_close_notify(dtls):
                state.ended(CLOSE_NOTIFY)

        dtls.on("statechange", on_state)
    for transceiver in pc.getTransceivers():
        _note_bye(transceiver.receiver, state, label)
    return state


def _received_close_notify(dtls: Any) -> bool:
    ssl = getattr(dtls, "_ssl", None)
    if ssl is None:
        return False
    try:
        return bool(ssl.get_shutdown() & SSL.RECEIVED_SHUTDOWN)
    except SSL.Error:
        return False


def _note_bye(receiver: Any, state: PeerEnd, label: str) -> None:
    handle = receiver._handle_rtcp_packet
    kind = getattr(receiver.track, "kind", "?")

    async def handle_rtcp_packet(packet: Any) -> None:
        if isinstance(packet, RtcpByePacket):
            if id(receiver) not in state.said_bye:
                logger.info(
                    "session %s: RTCP BYE for the %s sources %s: that track ends",
                    label,
                    kind,
                    packet.sources,
                )
            state.said_bye.add(id(receiver))
            carried = {id(r) for r in receiver.transport._rtp_router.ssrc_table.values()}
            if carried and carried <= state.said_bye:
                state.ended(RTCP_BYE)
        await handle(packet)

    receiver._handle_rtcp_packet = handle_rtcp_packet


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    dtls = aiortc.rtcdtlstransport.RTCDtlsTransport
    init = inspect.getsource(dtls.__init__)
    for name in ("self._ssl", "self._rtp_router"):
        if name not in init:
            problems.append(f"RTCDtlsTransport.{name.removeprefix('self.')}")
    if "self.ssrc_table" not in inspect.getsource(aiortc.rtcdtlstransport.RtpRouter.__init__):
        problems.append("RtpRouter.ssrc_table")
    if "SSL.ZeroReturnError" not in inspect.getsource(dtls._recv_next):
        problems.append("RTCDtlsTransport._recv_next ends on close_notify")
    receiver = aiortc.rtcrtpreceiver.RTCRtpReceiver
    if not inspect.iscoroutinefunction(getattr(receiver, "_handle_rtcp_packet", None)):
        problems.append("RTCRtpReceiver._handle_rtcp_packet")
    route = inspect.getsource(aiortc.rtcdtlstransport.RTCDtlsTransport._handle_rtcp_data)
    if "recipient._handle_rtcp_packet(packet)" not in route:
        problems.append("RTCDtlsTransport._handle_rtcp_data hands RTCP to recipients")
    if not hasattr(SSL, "RECEIVED_SHUTDOWN"):
        problems.append("OpenSSL.SSL.RECEIVED_SHUTDOWN")
    return problems
