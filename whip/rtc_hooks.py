"""Per-connection adjustments to aiortc that a production WHIP ingest needs.

Each function states the private attribute it touches; :mod:`whip.aiortc_compat` checks
them all at start-up. Why each exists (with measurements) is in ``docs/INTEROP.md``.

- :func:`restrict_host_addresses`: aioice gathers host candidates on every interface but
  skips 127.0.0.1; a loopback-only or NAT'd server must advertise exactly its configured
  addresses. Process-wide (it is configuration, not per session).
- :class:`WideCipherCertificate`: aiortc's DTLS context offers only ECDHE-ECDSA suites;
  when we are the DTLS client, a publisher with an RSA certificate finds no common suite.
- :func:`restrict_codecs`: aiortc receives every codec both sides support, not only
  the ones our answer offers: PCMU/PCMA/G722 on a new SSRC reached the audio receiver
  of an Opus-only answer. Each transceiver is trimmed to the answer's codecs.
- :func:`install_dtls_kick`: as DTLS client we send our first flight the instant our ICE
  check succeeds, often before the publisher (FFmpeg) reads DTLS; it is dropped and
  OpenSSL retransmits only after 1 s. We resend the identical datagram early.
- :func:`install_media_liveness`: aioice drops a peer after 6 unanswered consent checks
  (~33 s for FFmpeg, which never answers them). Authenticated inbound media (counted
  after SRTP unprotect, so spoofed datagrams do not count) or a consent answer is proof
  of life; none for ``timeout_s`` closes the ICE connection.
- :func:`compact_rate_counters`: every video receiver's bitrate estimator keeps a 1000
  bucket window as 1000 small objects (allocated twice: at creation and on the first
  packet). Under a burst of POSTs they are most of what the garbage collector scans. The
  same counter over two lists of ints allocates 2 objects instead. Process-wide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
import aiortc.rate
from aioice import stun
from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate
from aiortc.rtcdtlstransport import State as DtlsState

from whip.sdp import OfferSummary

logger = logging.getLogger(__name__)

_ECDSA_SUITES = (
    b"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:"
    b"ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA"
)
_RSA_SUITES = (
    b"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:"
    b"ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA"
)
DTLS_KICK_DELAYS_MS = (20, 60, 150, 300, 600)


_all_host_addresses = aioice.ice.get_host_addresses


def local_addresses() -> set[str]:
    """Every address of this machine's interfaces, loopback included."""
    return {*_all_host_addresses(use_ipv4=True, use_ipv6=True), "127.0.0.1", "::1"}


def restrict_host_addresses(addresses: Iterable[str]) -> None:
    """Make aioice gather host candidates on exactly ``addresses`` (process-wide).

    Touches ``aioice.ice.get_host_addresses`` (looked up at call time by
    ``Connection.gather_candidates``).
    """
    fixed = list(addresses)
    if not fixed:
        raise ValueError("at least one host address is needed")

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in fixed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


class CompactRateCounter(aiortc.rate.RateCounter):
    """aiortc's ``RateCounter`` (amounts in 1 ms buckets over a window) with the buckets
    kept in two lists of ints instead of one ``RateBucket`` object each.

    Same answers for the same calls (``tests/test_whip_rate_counter.py`` runs both side by
    side). One difference in cost only: a gap longer than the window clears the buckets
    at once instead of stepping through every millisecond of the gap (aiortc's does: a
    minute of silence costs 60,000 passes of a Python loop, on the event loop).
    """

    def __init__(self, window_size: int, scale: int = 8000) -> None:
        self._counts: list[int] = []
        self._values: list[int] = []
        self._total_count = 0
        self._total_value = 0
        super().__init__(window_size, scale)

    def add(self, value: int, now_ms: int) -> None:
        if self._origin_ms is None:
            self._origin_ms = now_ms
        else:
            self._erase_old(now_ms)
        index = (self._origin_index + now_ms - self._origin_ms) % self._window_size
        self._counts[index] += 1
        self._values[index] += value
        self._total_count += 1
        self._total_value += value

    def rate(self, now_ms: int) -> int | None:
        if self._origin_ms is not None:
            self._erase_old(now_ms)
            active_window_size = now_ms - self._origin_ms + 1
            if self._total_count > 0 and active_window_size > 1:
                return round(self._scale * self._total_value / active_window_size)
        return None

    def reset(self) -> None:
        self._counts = [0] * self._window_size
        self._values = [0] * self._window_size
        self._origin_index = 0
        self._origin_ms = None
        self._total_count = 0
        self._total_value = 0

    def _erase_old(self, now_ms: int) -> None:
        assert self._origin_ms is not None
        steps = now_ms - self._window_size + 1 - self._origin_ms
        if steps <= 0:
            return
        window = self._window_size
        if steps >= window:
            # Every bucket leaves the window; the totals are the buckets' sums.
            self._counts = [0] * window
            self._values = [0] * window
            self._total_count = 0
            self._total_value = 0
        else:
            counts, values = self._counts, self._values
            index = self._origin_index
            for _ in range(steps):
                self._total_count -= counts[index]
                self._total_value -= values[index]
                counts[index] = 0
                values[index] = 0
                index = (index + 1) % window
        self._origin_index = (self._origin_index + steps) % window
        self._origin_ms += steps


def compact_rate_counters() -> None:
    """Make aiortc's receive-side bitrate estimators use :class:`CompactRateCounter`
    (process-wide, idempotent).

    Touches ``aiortc.rate.RateCounter`` (looked up at call time by
    ``RemoteBitrateEstimator.__init__``).
    """
    aiortc.rate.RateCounter = CompactRateCounter  # type: ignore[misc]


class WideCipherCertificate(RTCCertificate):
    """An ECDSA certificate whose DTLS context also offers ECDHE-RSA suites.

    Touches ``RTCCertificate._create_ssl_context``.
    """

    def _create_ssl_context(self, srtp_profiles: Any) -> Any:
        context = super()._create_ssl_context(srtp_profiles)
        context.set_cipher_list(_ECDSA_SUITES + b":" + _RSA_SUITES)
        return context


def use_wide_certificate(pc: RTCPeerConnection) -> None:
    """Make ``pc``'s certificate a :class:`WideCipherCertificate` (before any transceiver
    exists).

    The key and certificate are the ones aiortc generated for ``pc`` in its constructor
    (a fresh ECDSA P-256 pair per peer connection): only the class changes, so each
    session keeps its own DTLS identity and no second pair is generated.
    Touches ``RTCPeerConnection.__certificates``, ``RTCCertificate._key`` and ``._cert``.
    """
    own = pc._RTCPeerConnection__certificates  # type: ignore[attr-defined]
    pc._RTCPeerConnection__certificates = [  # type: ignore[attr-defined]
        WideCipherCertificate(key=cert._key, cert=cert._cert) for cert in own
    ]


def restrict_codecs(transceiver: Any, summary: OfferSummary) -> bool:
    """Make ``transceiver`` hold exactly the codecs the answer offers; False when it
    offers none (the section is rejected: the caller makes the transceiver inactive).

    Call after ``setRemoteDescription`` and before ``createAnswer``. aiortc keeps every
    codec both sides support (an Opus-only plan still left PCMU, PCMA and G722 on the
    audio transceiver), and one list, ``RTCRtpTransceiver._codecs``, feeds both the
    answer's m-line and the receive parameters: the receiver's decoders by payload type
    and its ``RtpRouter`` registration. Trimmed to the plan, a payload type outside it
    routes nowhere (``rtp_unroutable``), even on an SSRC the router does not know yet.
    ``RTCRtpTransceiver.setCodecPreferences`` cannot do this here: aiortc applies
    preferences inside ``setRemoteDescription``, which also creates the transceiver.

    The list keeps aiortc's order (the offer's); the plan's payload types it lacks are
    left out, as :func:`whip.sdp.finalize_answer` leaves them out of the answer.
    Touches ``RTCRtpTransceiver._codecs`` and ``._get_mline_index()`` (the offer's
    section index, as :attr:`whip.sdp.SectionPlan.index`).
    """
    index = transceiver._get_mline_index()
    plan = next((p for p in summary.sections if p.index == index), None)
    if plan is None or not plan.accepted:
        return False
    keep = {*plan.payload_types, *plan.rtx_payload_types}
    codecs = [c for c in transceiver._codecs if c.payloadType in keep]
    if not any(c.payloadType in plan.payload_types for c in codecs):
        return False
    transceiver._codecs = codecs
    return True


def _dtls_transports(pc: RTCPeerConnection) -> list[Any]:
    seen: dict[int, Any] = {}
    for transceiver in pc.getTransceivers():
        transport = transceiver.receiver.transport
        seen[id(transport)] = transport
    return list(seen.values())


def install_dtls_kick(
    pc: RTCPeerConnection, delays_ms: tuple[int, ...] = DTLS_KICK_DELAYS_MS
) -> None:
    """Resend our first DTLS flight at ``delays_ms`` while nothing has come back.

    Only when we are the DTLS client and the transport is still connecting. A
    byte-identical duplicate looks like a retransmission to the peer: harmless if the
    first copy arrived. Call after ``setRemoteDescription``.
    Touches ``RTCIceTransport._send``, ``RTCDtlsTransport._role``, ``._state`` and
    ``RTCDtlsTransport.__rx_packets``.
    """
    for dtls in _dtls_transports(pc):
        ice = dtls.transport
        original_send = ice._send
        first: list[asyncio.Task[None]] = []

        async def kick(data: bytes, dtls: Any = dtls, send: Any = original_send) -> None:
            started = time.monotonic()
            for delay in delays_ms:
                await asyncio.sleep(max(0.0, started + delay / 1000 - time.monotonic()))
                if dtls._state != DtlsState.CONNECTING or dtls._RTCDtlsTransport__rx_packets:
                    return
                try:
                    await send(data)
                except ConnectionError:
                    return

        async def send_and_kick(
            data: bytes,
            dtls: Any = dtls,
            send: Any = original_send,
            first: list[asyncio.Task[None]] = first,
        ) -> None:
            await send(data)
            is_handshake = bool(data) and 20 <= data[0] <= 63
            if (
                not first
                and is_handshake
                and dtls._role == "client"
                and dtls._state == DtlsState.CONNECTING
            ):
                first.append(asyncio.create_task(kick(bytes(data)), name="dtls-kick"))

        ice._send = send_and_kick


@dataclass(slots=True)
class Liveness:
    """Proof-of-life bookkeeping for one peer connection (event loop only)."""

    timeout_s: float
    started: float = field(default_factory=time.monotonic)
    last_media: float | None = None
    last_consent_ok: float | None = None
    media_packets: int = 0
    consent_sent: int = 0
    consent_ok: int = 0
    expired: bool = False

    def last_life(self) -> float:
        """The newest moment the peer proved it is there."""
        return max(
            t for t in (self.started, self.last_media, self.last_consent_ok) if t is not None
        )


def install_media_liveness(
    pc: RTCPeerConnection,
    timeout_s: float,
    *,
    check_interval_s: float = 1.0,
    consent_interval_s: float = 5.0,
    on_expired: Callable[[Liveness], None] | None = None,
) -> Liveness:
    """Replace aioice's consent loop: media or a consent answer keeps the peer alive.

    Call after ``setRemoteDescription``, before ICE connects. When neither arrives for
    ``timeout_s`` the ICE connection is closed; aiortc then closes the peer connection
    (its state becomes ``closed``), which the reclaimer sees as the peer going away.
    Detection bound: ``timeout_s + check_interval_s``.
    Touches ``Connection.query_consent`` (shadowed per instance), ``Connection._nominated``,
    ``Connection._query_consent_task``, ``RTCDtlsTransport._handle_rtp_data`` and
    ``_handle_rtcp_data`` (called only after a successful SRTP/SRTCP unprotect).
    """
    state = Liveness(timeout_s)
    for dtls in _dtls_transports(pc):
        connection = dtls.transport._connection
        _count_authenticated_media(dtls, state)
        connection.query_consent = _consent_loop(
            connection, state, check_interval_s, consent_interval_s, on_expired
        )
    return state


def _count_authenticated_media(dtls: Any, state: Liveness) -> None:
    rtp = dtls._handle_rtp_data
    rtcp = dtls._handle_rtcp_data

    async def handle_rtp(data: bytes, arrival_time_ms: int) -> None:
        state.last_media = time.monotonic()
        state.media_packets += 1
        await rtp(data, arrival_time_ms)

    async def handle_rtcp(data: bytes) -> None:
        state.last_media = time.monotonic()
        state.media_packets += 1
        await rtcp(data)

    dtls._handle_rtp_data = handle_rtp
    dtls._handle_rtcp_data = handle_rtcp


def _consent_loop(
    connection: Any,
    state: Liveness,
    check_interval_s: float,
    consent_interval_s: float,
    on_expired: Callable[[Liveness], None] | None,
) -> Callable[[], Any]:
    async def ask(pair: Any) -> None:
        request = connection.build_request(pair, nominate=False)
        state.consent_sent += 1
        try:
            await pair.protocol.request(
                request,
                pair.remote_addr,
                integrity_key=connection.remote_password.encode("utf8"),
                retransmissions=0,
            )
        except (stun.TransactionError, ConnectionError, OSError):
            return
        state.consent_ok += 1
        state.last_consent_ok = time.monotonic()

    async def query_consent() -> None:
        state.started = time.monotonic()
        next_consent = state.started + consent_interval_s
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(check_interval_s)
                now = time.monotonic()
                if now >= next_consent:
                    next_consent = now + consent_interval_s
                    for pair in list(connection._nominated.values()):
                        task = asyncio.create_task(ask(pair), name="ice-consent")
                        pending.add(task)
                        task.add_done_callback(pending.discard)
                silent = now - state.last_life()
                if silent > state.timeout_s:
                    state.expired = True
                    logger.info(
                        "peer silent for %.1fs (> %.1fs): closing ICE", silent, state.timeout_s
                    )
                    if on_expired is not None:
                        on_expired(state)
                    connection._query_consent_task = None  # close() must not cancel us
                    await connection.close()
                    return
        finally:
            for task in pending:
                task.cancel()

    return query_consent
