"""Resend our first DTLS flight early when we are the DTLS client.

As DTLS client we send our first flight the instant our ICE check succeeds, often before
the publisher (FFmpeg) reads DTLS; it is dropped and OpenSSL retransmits only after 1 s.
:func:`install_dtls_kick` resends the identical datagram at :data:`DTLS_KICK_DELAYS_MS`
while nothing has come back. A byte-identical duplicate looks like a retransmission to the
peer: harmless if the first copy arrived.

aiortc internals touched: ``RTCIceTransport._send``, ``RTCDtlsTransport._role``,
``._state`` and ``RTCDtlsTransport.__rx_packets``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import aiortc.rtcdtlstransport
import aiortc.rtcicetransport
from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import State as DtlsState

from whip.rtc.peer import dtls_transports

DTLS_KICK_DELAYS_MS = (20, 60, 150, 300, 600)


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
    for dtls in dtls_transports(pc):
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


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    dtls = aiortc.rtcdtlstransport.RTCDtlsTransport
    if "__rx_packets" not in inspect.getsource(dtls):
        problems.append("RTCDtlsTransport.__rx_packets")
    dtls_src = inspect.getsource(dtls.__init__)
    for name in ("_role", "_state"):
        if f"self.{name} =" not in dtls_src:
            problems.append(f"RTCDtlsTransport.{name}")
    ice = aiortc.rtcicetransport.RTCIceTransport
    if "self._send = self._connection.send" not in inspect.getsource(ice.__init__):
        problems.append("RTCIceTransport._send")
    return problems
