"""Helpers for the ICE UDP tests: live pushes, the server side of a session, STUN checks
as a stranger would forge them, and a publisher that moves to another local port.

Everything is real: aiortc publishers over loopback, the server's own session objects
read through their public attributes, datagrams sent from real sockets.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from aioice import stun
from aioice.ice import Connection, StunProtocol

from tests.support.eventually import eventually
from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import ICE_SOCKETS_KEY, SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.live_stats import read_figures
from whip.rtc.ice_sockets import ice_connections
from whip.rtc.session_sockets import SessionSockets
from whip.rtc.udp_mux import UdpMux

SRTP_LIKE = bytes([0x80, 0x60, 0x00, 0x01]) + bytes(8) + b"\xab" * 100


def mux_of(server: TestServer) -> UdpMux:
    """The server's shared port (the test started it with ``ice__udp_mux=True``)."""
    sockets = server.app[ICE_SOCKETS_KEY]
    assert isinstance(sockets, UdpMux)
    return sockets


def session_sockets_of(server: TestServer) -> SessionSockets:
    """The server's per-session sockets (``ice__udp_mux=False``)."""
    sockets = server.app[ICE_SOCKETS_KEY]
    assert isinstance(sockets, SessionSockets)
    return sockets


def session_of(server: TestServer, publisher: AiortcPublisher) -> LiveSession:
    """The live session of ``publisher``'s run."""
    for session in server.app[SESSIONS_KEY].table.live():
        if session.run_id == publisher.run_id:
            return session
    raise AssertionError(f"no live session for run {publisher.run_id}")


def server_connection(server: TestServer, publisher: AiortcPublisher) -> Connection:
    """The server's aioice connection of ``publisher``'s session."""
    (connection,) = ice_connections(session_of(server, publisher).pc)
    return connection


def publisher_connection(publisher: AiortcPublisher) -> Connection:
    """The publisher's own aioice connection."""
    transport = publisher.pc.getTransceivers()[0].sender.transport
    connection: Connection = transport.transport.iceGatherer._connection
    return connection


async def live_push(
    server: TestServer, http: aiohttp.ClientSession, stream: str
) -> AiortcPublisher:
    """An aiortc publisher on ``/whip/{stream}``: 201, connected, first frame decoded."""
    publisher = AiortcPublisher()
    response = await publisher.publish(http, str(server.make_url(f"/whip/{stream}")))
    assert response.status == 201, await response.text()
    await asyncio.wait_for(publisher.connected.wait(), 20)
    await wait_for_type(server.app[TIMELINE_KEY], publisher.run_id, "first_frame")
    return publisher


async def frames_decoded(server: TestServer, publisher: AiortcPublisher) -> int:
    """Frames the server decoded so far for ``publisher``'s session."""
    return (await read_figures(session_of(server, publisher))).frames_decoded


async def keeps_decoding(server: TestServer, publisher: AiortcPublisher, more: int = 10) -> int:
    """Wait until ``publisher``'s session decodes ``more`` frames beyond now; returns the
    count reached."""
    start = await frames_decoded(server, publisher)

    async def advanced() -> int | None:
        now = await frames_decoded(server, publisher)
        return now if now >= start + more else None

    return await eventually(
        advanced, within=20, awaiting=f"{more} more decoded frames after {start}", every=0.05
    )


def binding_request(username: str | None, password: str | None) -> bytes:
    """A connectivity check as aioice signs one (``password`` None: unsigned)."""
    message = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    if username is not None:
        message.attributes["USERNAME"] = username
    message.attributes["PRIORITY"] = 1853824767
    message.attributes["ICE-CONTROLLING"] = 0x1122334455667788
    message.attributes["USE-CANDIDATE"] = None
    if password is not None:
        message.add_message_integrity(password.encode())
    message.add_fingerprint()
    return bytes(message)


def udp_socket() -> socket.socket:
    """A UDP socket on 127.0.0.1, any port (the caller closes it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


class _Forward(asyncio.DatagramProtocol):
    def __init__(self, target: StunProtocol) -> None:
        self.target = target

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.target.datagram_received(data, addr)

    def connection_lost(self, exc: Exception | None) -> None:
        self.target.connection_lost(exc)  # the publisher's close waits for it


async def move_to_new_port(publisher: AiortcPublisher) -> tuple[str, int]:
    """Rebind the publisher's ICE socket: a new local port on 127.0.0.1, the old socket
    closed (its protocol detached first, so aioice does not see a lost socket). Nothing
    tells the server: a NAT rebinding. Returns the new address."""
    (protocol,) = publisher_connection(publisher)._protocols
    old: asyncio.DatagramTransport = protocol.transport
    loop = asyncio.get_running_loop()
    new, _ = await loop.create_datagram_endpoint(
        lambda: _Forward(protocol), local_addr=("127.0.0.1", 0)
    )
    protocol.transport = new
    old.set_protocol(asyncio.DatagramProtocol())
    old.close()
    address: tuple[str, int] = new.get_extra_info("sockname")[:2]
    return address
