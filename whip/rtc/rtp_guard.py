"""RTP ingress guard: hostile media on one transport is refused or bounded, and counted.

aiortc's receive path has a few answers to bad input that an ingest server cannot
accept, and it drops several kinds of packet without counting them. :func:`guard_receiver`
fixes both for one receiver and its DTLS transport (the transport part once per
transport; with BUNDLE that is one per session). :func:`whip.rtc.tap.install_tap`
calls it for every tapped receiver, so every server-side receiver is guarded before it
connects. All of it runs on the event loop thread; the counters are plain ints
(:class:`RtpGuard`), read from any thread.

Refused before aiortc's DTLS transport sees them (``datagrams_refused``): an empty UDP
datagram (aiortc reads ``data[0]``: ``IndexError``) and an SRTP/SRTCP-range datagram
(first byte 128-191) longer than :data:`SRTP_MAX_DATAGRAM` (pylibsrtp's unprotect buffer
raises ``ValueError("packet is too long")``, which aiortc does not catch). Either
exception ends ``RTCDtlsTransport``'s receive loop, and with it the session
(``peer_gone``). Neither datagram is authenticated, and aioice queues a datagram from any
source address: before this guard, anyone who could reach a session's media port ended
it with one datagram. So this counter does not blame the publisher.

Authenticated RTP (after SRTP unprotect) that aiortc would drop without a trace:

- ``rtp_unroutable``: no receiver takes it (``RtpRouter.route_rtp`` answers None): a
  payload type not negotiated on that SSRC's m-line, or an unknown SSRC whose payload
  type is not negotiated (or is negotiated on several m-lines).
- ``rtp_ssrc_refused``: from a new SSRC once the transport knows :data:`MAX_SSRCS`.
  aiortc remembers every SSRC it ever routed, for the life of the connection (router
  table, receiver statistics, active sources), and reports on each in one RTCP receiver
  report per receiver: past 31 sources its 5-bit count overflows (the peer gets a
  corrupt packet), past about 56 it no longer fits an SRTCP packet: the ``ValueError``
  kills the receiver's RTCP task, after which ``RTCRtpReceiver.stop()`` waits forever, so the peer
  connection never closes and the session's close never finishes (its media permit and
  decode threads leak). On aiortc 1.16.0, 80 SSRCs of one packet each did it
  (``tests/test_hostile_media.py`` sends them).
- ``rtp_malformed``: a payload the depayloader rejects (an H.264 NAL type aiortc does
  not support, a truncated STAP-A, a short VP8 descriptor). aiortc drops the packet
  before its jitter buffer, which leaves a hole there: that track's frames stall until
  the buffer slides, 512 packets later (aiortc's behaviour, counted, not changed here).

NACK bookkeeping: aiortc's ``NackGenerator`` walks every sequence number of a forward
jump one at a time (up to 32767 per packet), then keeps only the last
``RTP_HISTORY_SIZE`` (128). A sender whose sequence numbers jump by 32767 on every
packet held the event loop for milliseconds per packet (``docs/PERFORMANCE.md``, "Hostile
RTP"): a few dozen packets a second stalled the whole server. :class:`BoundedNackGenerator`
skips the part that would be thrown away: same missing set, same answers, at most 128 steps.

aiortc private names touched (:func:`internals_problems` verifies each; the one start-up
check includes it):

- ``RTCIceTransport._recv`` (instance attribute, shadowed) and
  ``RTCDtlsTransport._recv_next`` (reads ``data[0]``, unprotects with pylibsrtp, whose
  ``Session`` buffer is 1500 bytes)
- ``RTCDtlsTransport._rtp_router``: ``RtpRouter.route_rtp`` (shadowed per instance) and
  ``RtpRouter.ssrc_table``
- ``RTCRtpReceiver._handle_rtp_packet`` (shadowed per instance), ``._enabled``,
  ``.__codecs``, ``.__nack_generator`` (replaced) and ``RtpPacket._data`` (set by a
  successful depayload)
- ours: ``_whip_ingest_guard`` on the DTLS transport and on the receiver
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiortc.rtcdtlstransport
import aiortc.rtcicetransport
import aiortc.rtcrtpreceiver
import pylibsrtp
from aiortc.codecs import is_rtx
from aiortc.rtcrtpreceiver import NackGenerator
from aiortc.rtp import RTP_HISTORY_SIZE, RtpPacket
from aiortc.utils import uint16_add, uint16_gt

from whip.rtc.source_text import source_text

logger = logging.getLogger(__name__)

SRTP_MAX_DATAGRAM = 1500
"""The longest SRTP/SRTCP datagram pylibsrtp unprotects (its ``Session`` buffer)."""
MAX_SSRCS = 16
"""SSRCs one transport may learn. A publisher needs a handful (video, its RTX, audio;
simulcast triples the video ones). aiortc sends one receiver report per receiver with a
block per source it ever saw, and never splits it: past 31 blocks the 5-bit count
overflows (a corrupt RTCP packet), past about 56 the packet no longer fits SRTCP."""
DISCARD_REASONS = ("datagram_refused", "unroutable", "ssrc_limit", "malformed")
"""The keys of :meth:`RtpGuard.counts` (the ``reason`` label of the metrics)."""
_MARK = "_whip_ingest_guard"
_CODECS = "_RTCRtpReceiver__codecs"
_NACK = "_RTCRtpReceiver__nack_generator"


@dataclass(slots=True)
class RtpGuard:
    """The counters of one guarded DTLS transport (module doc). Loop thread writes."""

    datagrams_refused: int = 0
    rtp_unroutable: int = 0
    rtp_ssrc_refused: int = 0
    rtp_malformed: int = 0
    routed_ssrcs: set[int] = field(default_factory=set)
    """SSRCs a receiver took (at most :data:`MAX_SSRCS`): one of these that stops
    routing lost its receiver to a close, which is not the sender's fault."""

    @staticmethod
    def no_counts() -> dict[str, int]:
        """Every reason at zero (the shape of :meth:`counts`)."""
        return dict.fromkeys(DISCARD_REASONS, 0)

    def counts(self) -> dict[str, int]:
        """The counters by reason (the ``reason`` label of the session metrics)."""
        return {
            "datagram_refused": self.datagrams_refused,
            "unroutable": self.rtp_unroutable,
            "ssrc_limit": self.rtp_ssrc_refused,
            "malformed": self.rtp_malformed,
        }

    def _first(self, count: int, what: str, *args: object) -> None:
        if count == 1:
            logger.warning("RTP guard: " + what + " (first of possibly many)", *args)


class BoundedNackGenerator(NackGenerator):
    """aiortc's ``NackGenerator`` with a forward jump costing at most
    ``RTP_HISTORY_SIZE`` steps (module doc). Same ``missing`` set and return value."""

    def add(self, packet: RtpPacket) -> bool:
        last = self.max_seq
        seq = packet.sequence_number
        jump = last is not None and uint16_gt(seq, last) and uint16_add(seq, -last)
        if jump and jump > RTP_HISTORY_SIZE + 1:
            # Every number before seq - RTP_HISTORY_SIZE would be truncated right away.
            self.max_seq = uint16_add(seq, -(RTP_HISTORY_SIZE + 1))
        return bool(super().add(packet))


def guard_receiver(receiver: Any) -> RtpGuard:
    """Guard ``receiver`` (an ``RTCRtpReceiver`` not yet started) and its DTLS transport.

    Idempotent per transport and per receiver; returns the transport's counters. Call on
    the event loop thread after ``setRemoteDescription`` (BUNDLE has picked the transport).
    It checks nothing itself: the app checks every internal once, at creation
    (:func:`whip.rtc.compat.check_internals`); :func:`whip.rtc.tap.install_tap` calls it.
    """
    transport = receiver.transport
    guard: RtpGuard | None = getattr(transport, _MARK, None)
    if guard is None:
        guard = RtpGuard()
        _filter_datagrams(transport.transport, guard)
        _count_routing(transport._rtp_router, guard)
        setattr(transport, _MARK, guard)
    if getattr(receiver, _MARK, None) is None:
        _count_malformed(receiver, guard)
        nack = getattr(receiver, _NACK)
        if nack is not None and type(nack) is NackGenerator:
            setattr(receiver, _NACK, BoundedNackGenerator())
        setattr(receiver, _MARK, guard)
    return guard


def discarded_by_reason(receivers: Iterable[Any]) -> dict[str, int]:
    """The counters of ``receivers``' guards, summed by reason (each transport once)."""
    found = RtpGuard.no_counts()
    for guard in guards_of(receivers):
        for reason, count in guard.counts().items():
            found[reason] += count
    return found


def guards_of(receivers: Iterable[Any]) -> list[RtpGuard]:
    """The distinct guards of ``receivers``' transports (each transport once)."""
    found: dict[int, RtpGuard] = {}
    for receiver in receivers:
        guard = getattr(receiver, _MARK, None)
        if isinstance(guard, RtpGuard):
            found[id(guard)] = guard
    return list(found.values())


def _filter_datagrams(ice: Any, guard: RtpGuard) -> None:
    receive = ice._recv

    async def recv() -> bytes:
        while True:
            data: bytes = await receive()
            if data and not (127 < data[0] < 192 and len(data) > SRTP_MAX_DATAGRAM):
                return data
            guard.datagrams_refused += 1
            guard._first(
                guard.datagrams_refused, "refused a %d-byte datagram aiortc cannot take", len(data)
            )

    ice._recv = recv


def _count_routing(router: Any, guard: RtpGuard) -> None:
    route = router.route_rtp

    def route_rtp(packet: RtpPacket) -> Any:
        table = router.ssrc_table
        if packet.ssrc not in table and len(table) >= MAX_SSRCS:
            guard.rtp_ssrc_refused += 1
            guard._first(
                guard.rtp_ssrc_refused, "refused SSRC %d: %d already known", packet.ssrc, len(table)
            )
            return None
        found = route(packet)
        if found is not None:
            guard.routed_ssrcs.add(packet.ssrc)
        elif packet.ssrc in table or packet.ssrc not in guard.routed_ssrcs:
            # (Not counted: an SSRC that routed before and has left the table, i.e. aiortc
            # unregistered its receiver while closing the peer and media still arrives.)
            guard.rtp_unroutable += 1
            guard._first(
                guard.rtp_unroutable,
                "no receiver for RTP with SSRC %d, payload type %d",
                packet.ssrc,
                packet.payload_type,
            )
        return found

    router.route_rtp = route_rtp


def _count_malformed(receiver: Any, guard: RtpGuard) -> None:
    handle = receiver._handle_rtp_packet

    async def handle_rtp_packet(packet: RtpPacket, arrival_time_ms: int) -> None:
        await handle(packet, arrival_time_ms=arrival_time_ms)
        # aiortc sets _data on every packet it depayloads (b"" for an empty payload);
        # an RTX packet is replaced by the packet it carries, so it never gets one.
        if packet.payload and not hasattr(packet, "_data") and receiver._enabled:
            codec = getattr(receiver, _CODECS).get(packet.payload_type)
            if codec is not None and not is_rtx(codec):
                guard.rtp_malformed += 1
                guard._first(
                    guard.rtp_malformed,
                    "%s payload the depayloader rejects (payload type %d)",
                    codec.name,
                    packet.payload_type,
                )

    receiver._handle_rtp_packet = handle_rtp_packet


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    source = source_text

    ice = aiortc.rtcicetransport.RTCIceTransport
    need("self._recv = self._connection.recv" in source(ice.__init__), "RTCIceTransport._recv")
    dtls = aiortc.rtcdtlstransport.RTCDtlsTransport
    recv_next = source(dtls._recv_next)
    need("await self.transport._recv()" in recv_next, "RTCDtlsTransport reads transport._recv")
    need("first_byte = data[0]" in recv_next, "RTCDtlsTransport._recv_next reads data[0]")
    need("self._rx_srtp.unprotect(data)" in recv_next, "RTCDtlsTransport unprotects SRTP")
    need(
        f'ffi.new("char[]", {SRTP_MAX_DATAGRAM})' in source(pylibsrtp.Session.__init__),
        f"pylibsrtp.Session buffer of {SRTP_MAX_DATAGRAM} bytes",
    )
    need("self._rtp_router = RtpRouter()" in source(dtls.__init__), "RTCDtlsTransport._rtp_router")
    handle_data = source(dtls._handle_rtp_data)
    need("self._rtp_router.route_rtp(packet)" in handle_data, "RTCDtlsTransport routes RTP")
    need("receiver._handle_rtp_packet(" in handle_data, "RtpRouter hands RTP to the receiver")
    router = aiortc.rtcdtlstransport.RtpRouter
    need("self.ssrc_table" in source(router.__init__), "RtpRouter.ssrc_table")
    need(inspect.isfunction(getattr(router, "route_rtp", None)), "RtpRouter.route_rtp")
    receiver = aiortc.rtcrtpreceiver.RTCRtpReceiver
    need(
        "self.__nack_generator = NackGenerator()" in source(receiver.__init__),
        "RTCRtpReceiver.__nack_generator",
    )
    handle = source(receiver._handle_rtp_packet)
    for needle in (
        "if not self._enabled",
        "self.__codecs.get(packet.payload_type)",
        "is_rtx(codec)",
        "self.__nack_generator.add(packet)",
        "packet._data = depayload(codec, packet.payload)",
        "except ValueError",
    ):
        need(needle in handle, f"RTCRtpReceiver._handle_rtp_packet: {needle}")
    nack = source(NackGenerator.add)
    need("self.truncate()" in nack and "self.missing.add(seq)" in nack, "NackGenerator.add")
    return problems
