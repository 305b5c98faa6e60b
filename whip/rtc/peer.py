"""Peer connections: the one way whip-ingest makes one, and their transports.

:func:`new_peer_connection` is the factory every part uses (the server's negotiation by
default, the publishers of tests and benches): no ICE servers. aiortc's default
configuration names a public STUN server, an address off this machine; the server
gathers host candidates only (``server.public_hosts`` covers a NAT) and names
configured STUN/TURN servers to publishers in ``Link`` headers, so an unreachable server
can never stall an answer (aioice waits 5 s for one).
"""

from __future__ import annotations

import logging
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection

logger = logging.getLogger(__name__)


def new_peer_connection() -> RTCPeerConnection:
    """An aiortc peer connection with no ICE servers (module doc)."""
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


async def close_quietly(pc: RTCPeerConnection, what: str) -> None:
    """Close ``pc``; an error is logged (``what`` says whose), never raised over the
    caller's own. Cancellation: the close may be left half-way; aiortc's own teardown
    tolerates a second ``close()``."""
    try:
        await pc.close()
    except Exception:
        logger.exception("%s: peer close failed", what)


def dtls_transports(pc: RTCPeerConnection) -> list[Any]:
    """The distinct DTLS transports of ``pc``'s receivers (one with BUNDLE)."""
    seen: dict[int, Any] = {}
    for transceiver in pc.getTransceivers():
        transport = transceiver.receiver.transport
        seen[id(transport)] = transport
    return list(seen.values())
