"""The DTLS kick (:mod:`whip.rtc.dtls_kick`): as DTLS client, resend our first flight early.

Two real aiortc peers on 127.0.0.1. The publisher offers (``a=setup:actpass``, aiortc's
own), so the server side, the answerer, answers ``a=setup:active`` and is the DTLS
client: it sends the first flight (ClientHello) the moment its ICE check succeeds. The
publisher plays FFmpeg, which does not read DTLS yet at that moment: a test-side fault on
the publisher's peer (its ``RTCIceTransport._recv``, an aiortc instance attribute) drops
every DTLS datagram it receives during its first :data:`DEAF_S`.

Pinned here, as the module docstring states it:

- with :func:`install_dtls_kick`, the server's first flight goes out more than once,
  byte-identical, before the publisher answers, and the connection then completes;
- once the publisher has answered, nothing more is resent (also when nothing is lost,
  and also while the server still waits for the rest of the handshake: the kick stops
  as soon as anything came back, not only once DTLS is connected);
- the control, without the kick: the first flight goes out once, and what reaches the
  publisher next is OpenSSL's own retransmission after 1 s, a new record (counts are
  asserted, not durations).

What each side sent and received is recorded in one ordered log: the server's sends by
wrapping its ``RTCIceTransport._send`` *before* the kick is installed (so the kick's
resends pass through the recorder too), the publisher's by wrapping its transport.

Checked to fail (then restored): with the role check in ``send_and_kick`` asking for
``"server"`` (no kick) the resend test fails, one copy before the answer; with the guard
in ``kick`` removed (resend whatever happened) the nothing-more test fails; with only
its ``__rx_packets`` half removed the stays-silent test fails; with ``bytes(data)``
replaced by a copy whose record sequence number is bumped, the byte-identity assertion
fails.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from tests.support.loopback import ConnectionStates, LoopbackPeers, is_dtls, loopback_peers
from whip.rtc.dtls_kick import DTLS_KICK_DELAYS_MS, install_dtls_kick
from whip.rtc.peer import dtls_transports

DEAF_S = 0.3
"""How long the publisher drops the DTLS datagrams it receives, from the first one
(FFmpeg's deaf time)."""
KICK_END_WAIT_S = 5.0


@pytest.fixture
async def peers() -> AsyncIterator[LoopbackPeers]:
    async with loopback_peers() as pool:
        yield pool


@dataclass
class DatagramLog:
    """Every DTLS datagram of the handshake, in the order it happened."""

    entries: list[tuple[str, bytes]] = field(default_factory=list)

    def of(self, kind: str) -> list[bytes]:
        return [data for what, data in self.entries if what == kind]

    @property
    def first_flight(self) -> bytes:
        return self.of("server_sent")[0]

    def split_at_answer(self) -> tuple[list[bytes], list[bytes]]:
        """The server's DTLS sends before the publisher's first DTLS datagram, and after."""
        answered = next(i for i, (what, _) in enumerate(self.entries) if what == "publisher_sent")
        before = [d for what, d in self.entries[:answered] if what == "server_sent"]
        after = [d for what, d in self.entries[answered:] if what == "server_sent"]
        return before, after


def record_server_sends(server: RTCPeerConnection, log: DatagramLog) -> None:
    ice = dtls_transports(server)[0].transport
    send = ice._send

    async def recording_send(data: bytes) -> None:
        if is_dtls(data):
            log.entries.append(("server_sent", bytes(data)))
        await send(data)

    ice._send = recording_send


@dataclass(frozen=True)
class Deafness:
    """What the publisher drops of the DTLS it receives (all of it is logged)."""

    first_s: float = 0.0
    """Every DTLS datagram within this long of the first one (FFmpeg not reading yet)."""
    second_flight_s: float = 0.0
    """The server's second flight, within this long of its first datagram (so the server
    stays CONNECTING after the publisher's answer came back)."""


def deafen_publisher(publisher: RTCPeerConnection, log: DatagramLog, deafness: Deafness) -> None:
    """Apply ``deafness`` to what the publisher receives; log its DTLS sends too."""
    ice = dtls_transports(publisher)[0].transport
    receive, send = ice._recv, ice._send
    first: list[tuple[float, bytes]] = []
    second_at: list[float] = []

    def drops(data: bytes, now: float) -> bool:
        if not first:
            first.append((now, data))
        started, first_data = first[0]
        if now - started < deafness.first_s:
            return True
        if data == first_data:
            return False
        if not second_at:
            second_at.append(now)
        return now - second_at[0] < deafness.second_flight_s

    async def deaf_receive() -> Any:
        while True:
            data = await receive()
            if not is_dtls(data):
                return data
            if drops(bytes(data), time.monotonic()):
                log.entries.append(("publisher_dropped", bytes(data)))
                continue
            log.entries.append(("publisher_received", bytes(data)))
            return data

    async def recording_send(data: bytes) -> None:
        if is_dtls(data):
            log.entries.append(("publisher_sent", bytes(data)))
        await send(data)

    ice._recv = deaf_receive
    ice._send = recording_send


async def handshake(peers: LoopbackPeers, *, kick: bool, deafness: Deafness) -> DatagramLog:
    """Connect a publisher to a server side (with or without the kick); return the log
    once both are connected and the kick, if any, has ended."""
    log = DatagramLog()
    publisher, server = peers.new(), peers.new()
    publisher_states, server_states = ConnectionStates(publisher), ConnectionStates(server)
    offer = await peers.publisher_offer(publisher, audio=False)
    assert "a=setup:actpass" in offer
    await server.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    for transceiver in server.getTransceivers():
        transceiver.direction = "recvonly"
    record_server_sends(server, log)
    if kick:
        install_dtls_kick(server)
    await server.setLocalDescription(await server.createAnswer())
    answer = server.localDescription.sdp
    assert "a=setup:active" in answer, "the server side is the DTLS client"
    deafen_publisher(publisher, log, deafness)
    await publisher.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    await server_states.reached("connected")
    await publisher_states.reached("connected")
    # The kick's task ends on its own (at its next delay, or after its last one): once it
    # has, nothing can resend the first flight any more.
    kicks = [t for t in asyncio.all_tasks() if t.get_name() == "dtls-kick"]
    async with asyncio.timeout(KICK_END_WAIT_S):
        await asyncio.gather(*kicks)
    assert server_states.history == ["connecting", "connected"]
    return log


async def test_the_first_flight_is_resent_identically_until_the_publisher_answers(
    peers: LoopbackPeers,
) -> None:
    log = await handshake(peers, kick=True, deafness=Deafness(first_s=DEAF_S))
    first = log.first_flight
    before, after = log.split_at_answer()
    assert len(before) >= 2, f"the first flight went out {len(before)} time(s) before the answer"
    assert len(before) <= 1 + len(DTLS_KICK_DELAYS_MS)
    assert all(copy == first for copy in before), "every resend is byte-identical"
    dropped = log.of("publisher_dropped")
    assert dropped and all(copy == first for copy in dropped)
    assert log.of("publisher_received")[0] == first, "a copy got through after the deaf time"
    assert first not in after, "nothing is resent once the publisher answered"
    assert log.of("server_sent").count(first) == len(before)


async def test_nothing_is_resent_once_the_handshake_is_done(peers: LoopbackPeers) -> None:
    log = await handshake(peers, kick=True, deafness=Deafness())
    before, after = log.split_at_answer()
    assert log.of("publisher_dropped") == []
    assert all(copy == log.first_flight for copy in before)
    assert log.first_flight not in after
    assert log.of("server_sent").count(log.first_flight) == len(before)


async def test_the_kick_stays_silent_once_anything_came_back(peers: LoopbackPeers) -> None:
    # The publisher answers the first flight at once, then ignores the server's second
    # flight for longer than the kick's last delay: the server stays CONNECTING with the
    # answer in hand, and only OpenSSL's own retransmission of that flight completes it.
    log = await handshake(
        peers, kick=True, deafness=Deafness(second_flight_s=DTLS_KICK_DELAYS_MS[-1] / 1000)
    )
    before, after = log.split_at_answer()
    dropped = log.of("publisher_dropped")
    assert dropped and log.first_flight not in dropped
    assert log.first_flight not in after, "a first-flight copy went out after the answer"
    assert log.of("server_sent").count(log.first_flight) == len(before)


async def test_without_the_kick_the_first_flight_waits_for_openssls_retransmit(
    peers: LoopbackPeers,
) -> None:
    log = await handshake(peers, kick=False, deafness=Deafness(first_s=DEAF_S))
    first = log.first_flight
    before, _ = log.split_at_answer()
    assert log.of("server_sent").count(first) == 1, "no early copy without the kick"
    assert len(before) == 2, "the first flight, then OpenSSL's own retransmission"
    retransmit = before[1]
    assert retransmit != first
    # The same ClientHello in a new record: only the record's epoch and sequence number
    # (bytes 3-10 of the DTLS record header) differ.
    assert (retransmit[:3], retransmit[11:]) == (first[:3], first[11:])
    assert log.of("publisher_received")[0] == retransmit
