"""Media liveness: authenticated media or a consent answer keeps a peer alive.

aioice drops a peer after 6 unanswered consent checks (~33 s for FFmpeg, which never
answers them). :func:`install_media_liveness` replaces aioice's consent loop: inbound
media counted after SRTP unprotect (so spoofed datagrams do not count) or a consent
answer is proof of life; none for ``timeout_s`` closes the ICE connection.

aiortc/aioice internals touched: ``Connection.query_consent`` (shadowed per instance),
``Connection._nominated``, ``Connection._query_consent_task``,
``RTCDtlsTransport._handle_rtp_data`` and ``_handle_rtcp_data`` (called only after a
successful SRTP/SRTCP unprotect).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
import aiortc.rtcdtlstransport
from aioice import stun
from aiortc import RTCPeerConnection

from whip.rtc.peer import dtls_transports

logger = logging.getLogger(__name__)


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
    for dtls in dtls_transports(pc):
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


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    connection = aioice.ice.Connection
    if not inspect.iscoroutinefunction(getattr(connection, "query_consent", None)):
        problems.append("aioice.ice.Connection.query_consent")
    init = inspect.getsource(connection.__init__)
    for name in ("_nominated", "_query_consent_task"):
        if name not in init:
            problems.append(f"aioice.ice.Connection.{name}")
    dtls = aiortc.rtcdtlstransport.RTCDtlsTransport
    for name in ("_handle_rtp_data", "_handle_rtcp_data"):
        if not inspect.iscoroutinefunction(getattr(dtls, name, None)):
            problems.append(f"RTCDtlsTransport.{name}")
    return problems
