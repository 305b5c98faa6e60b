"""Per-connection adjustments to aiortc that a production WHIP ingest needs.

Each function states the private attribute it touches; :mod:`whip.aiortc_compat` checks
them all at start-up. Why each exists (with measurements) is in ``docs/INTEROP.md``.

- :func:`restrict_host_addresses`: aioice gathers host candidates on every interface but
  skips 127.0.0.1; a loopback-only or NAT'd server must advertise exactly its configured
  addresses. Process-wide (it is configuration, not per session).
- :class:`WideCipherCertificate`: aiortc's DTLS context offers only ECDHE-ECDSA suites;
  when we are the DTLS client, a publisher with an RSA certificate finds no common suite.
- :func:`install_dtls_kick`: as DTLS client we send our first flight the instant our ICE
  check succeeds, often before the publisher (FFmpeg) reads DTLS; it is dropped and
  OpenSSL retransmits only after 1 s. We resend the identical datagram early.
- :func:`install_media_liveness`: aioice drops a peer after 6 unanswered consent checks
  (~33 s for FFmpeg, which never answers them). Authenticated inbound media (counted
  after SRTP unprotect, so spoofed datagrams do not count) or a consent answer is proof
  of life; none for ``timeout_s`` closes the ICE connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
from aioice import stun
from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate
from aiortc.rtcdtlstransport import State as DtlsState

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


class WideCipherCertificate(RTCCertificate):
    """An ECDSA certificate whose DTLS context also offers ECDHE-RSA suites.

    Touches ``RTCCertificate._create_ssl_context``.
    """

    def _create_ssl_context(self, srtp_profiles: Any) -> Any:
        context = super()._create_ssl_context(srtp_profiles)
        context.set_cipher_list(_ECDSA_SUITES + b":" + _RSA_SUITES)
        return context


def use_wide_certificate(pc: RTCPeerConnection) -> None:
    """Give ``pc`` a :class:`WideCipherCertificate` (before any transceiver exists).

    Touches ``RTCPeerConnection.__certificates``.
    """
    pc._RTCPeerConnection__certificates = [  # type: ignore[attr-defined]
        WideCipherCertificate.generateCertificate()
    ]


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
