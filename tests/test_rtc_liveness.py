"""Media liveness (:mod:`whip.rtc.liveness`): media or a consent answer keeps a peer alive.

``tests/test_whip_liveness.py`` shows the whole server outliving stock aioice's consent
expiry with FFmpeg; it never calls :func:`install_media_liveness` itself. This file does,
on two real aiortc peers (127.0.0.1): the server side (the answerer) gets the liveness,
the publisher is the test's to silence.

Pinned here, as the module docstring states them:

- inbound media counts once it passed SRTP unprotect: every authenticated RTP/RTCP
  packet is counted, a spoofed datagram from another socket is not;
- a consent answer is proof of life: a publisher that sends nothing but answers the
  consent checks stays alive well past ``timeout_s``;
- media is proof of life too: a publisher that never answers consent (FFmpeg) but sends
  media stays alive;
- neither for ``timeout_s`` closes the ICE connection: ``on_expired`` runs with the peer
  silent longer than ``timeout_s``, and aiortc then closes the peer connection.

The publisher is silenced by test-side faults on its own peer: its ``RTCIceTransport._send``
drops every DTLS/SRTP datagram (``mute``), its aioice ``Connection.request_received``
ignores binding requests (``ignore_consent``, counted). Waits are on events: counters
here set an event when they reach a number.

Checked to fail (then restored): with ``state.media_packets += 1`` moved into a wrapper
of ``RTCIceTransport._recv`` (before unprotect), the spoofing test fails; with the
``state.last_consent_ok = ...`` line dropped, the consent test fails (the peer expires);
with ``handle_rtp``/``handle_rtcp`` not updating ``last_media``, the media test fails; with
``await connection.close()`` dropped, the silence test fails (no ``closed``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from tests.support.loopback import ConnectionStates, LoopbackPeers, loopback_peers
from whip.rtc.liveness import Liveness, install_media_liveness
from whip.rtc.peer import dtls_transports

WAIT_S = 15.0
SPOOFED = 20
SPOOF_MARK = b"\x80\x6fspoofed-by-test"
"""The start of each spoofed datagram: RTP range (0x80), payload type 111, not RTCP."""


@pytest.fixture
async def peers() -> AsyncIterator[LoopbackPeers]:
    async with loopback_peers() as pool:
        yield pool


class Tally:
    """A counter whose values can be awaited."""

    def __init__(self) -> None:
        self.count = 0
        self._waiters: list[tuple[int, asyncio.Event]] = []

    def add(self) -> None:
        self.count += 1
        for wanted, event in self._waiters:
            if self.count >= wanted:
                event.set()

    async def reaches(self, wanted: int, within: float = WAIT_S) -> None:
        event = asyncio.Event()
        self._waiters.append((wanted, event))
        if self.count >= wanted:
            event.set()
        try:
            async with asyncio.timeout(within):
                await event.wait()
        except TimeoutError:
            raise AssertionError(f"count {self.count} never reached {wanted}") from None


@dataclass
class Pair:
    publisher: RTCPeerConnection
    server: RTCPeerConnection
    liveness: Liveness
    server_states: ConnectionStates
    authenticated: Tally = field(default_factory=Tally)
    """SRTP/SRTCP packets the server's DTLS transport accepted (after unprotect)."""
    spoofed_read: Tally = field(default_factory=Tally)
    """Spoofed datagrams the server's DTLS transport has read..."""
    spoofed_done: Tally = field(default_factory=Tally)
    """...and is through with (it asked for the next datagram)."""
    expired: list[float] = field(default_factory=list)
    """How long the peer had been silent, each time ``on_expired`` ran."""
    expired_event: asyncio.Event = field(default_factory=asyncio.Event)


async def connect(
    peers: LoopbackPeers,
    *,
    media: bool,
    timeout_s: float,
    consent_interval_s: float,
    check_interval_s: float = 0.05,
) -> Pair:
    """A publisher (audio, with or without a track) connected to a server side that has
    the media liveness."""
    publisher, server = peers.new(), peers.new()
    server_states = ConnectionStates(server)
    publisher_states = ConnectionStates(publisher)
    offer = await peers.publisher_offer(publisher, video=False, media=media)
    await server.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    for transceiver in server.getTransceivers():
        transceiver.direction = "recvonly"
    expired: list[float] = []
    expired_event = asyncio.Event()

    def on_expired(state: Liveness) -> None:
        expired.append(time.monotonic() - state.last_life())
        expired_event.set()

    liveness = install_media_liveness(
        server,
        timeout_s,
        check_interval_s=check_interval_s,
        consent_interval_s=consent_interval_s,
        on_expired=on_expired,
    )
    pair = Pair(
        publisher, server, liveness, server_states, expired=expired, expired_event=expired_event
    )
    count_authenticated(server, pair.authenticated)
    count_spoofed_reads(server, pair.spoofed_read, pair.spoofed_done)
    await server.setLocalDescription(await server.createAnswer())
    await publisher.setRemoteDescription(
        RTCSessionDescription(sdp=server.localDescription.sdp, type="answer")
    )
    await server_states.reached("connected")
    await publisher_states.reached("connected")
    return pair


def count_authenticated(server: RTCPeerConnection, tally: Tally) -> None:
    """Count what aiortc hands on after a successful unprotect (outside the liveness's
    own wrappers, so both see the same packets)."""
    dtls = dtls_transports(server)[0]
    rtp, rtcp = dtls._handle_rtp_data, dtls._handle_rtcp_data

    async def handle_rtp(data: bytes, arrival_time_ms: int) -> None:
        tally.add()
        await rtp(data, arrival_time_ms)

    async def handle_rtcp(data: bytes) -> None:
        tally.add()
        await rtcp(data)

    dtls._handle_rtp_data = handle_rtp
    dtls._handle_rtcp_data = handle_rtcp


def mute(publisher: RTCPeerConnection) -> None:
    """The publisher sends no more DTLS, SRTP or SRTCP (STUN still goes out)."""
    ice = dtls_transports(publisher)[0].transport

    async def dropped(data: bytes) -> None:
        return None

    ice._send = dropped


def ignore_consent(publisher: RTCPeerConnection) -> Tally:
    """The publisher stops answering binding requests; returns their count."""
    connection = dtls_transports(publisher)[0].transport._connection
    ignored = Tally()

    def request_received(message: Any, addr: Any, protocol: Any) -> None:
        ignored.add()

    connection.request_received = request_received
    return ignored


def count_consent(publisher: RTCPeerConnection) -> Tally:
    """Count the binding requests the publisher receives (and still answers)."""
    connection = dtls_transports(publisher)[0].transport._connection
    answer = connection.request_received
    seen = Tally()

    def request_received(message: Any, addr: Any, protocol: Any) -> None:
        seen.add()
        answer(message, addr, protocol)

    connection.request_received = request_received
    return seen


def count_spoofed_reads(server: RTCPeerConnection, read: Tally, done: Tally) -> None:
    """Count the spoofed datagrams the server's DTLS transport reads, and those it is
    through with. Installed before DTLS starts, so every read goes through it."""
    ice = dtls_transports(server)[0].transport
    receive = ice._recv
    last: list[bytes] = [b""]

    async def counting_receive() -> bytes:
        if last[0].startswith(SPOOF_MARK):
            done.add()  # DTLS asks for the next datagram: it is through with the last one
        data: bytes = await receive()
        last[0] = data
        if data.startswith(SPOOF_MARK):
            read.add()
        return data

    ice._recv = counting_receive


def server_address(server: RTCPeerConnection) -> tuple[str, int]:
    line = next(
        line for line in server.localDescription.sdp.splitlines() if line.startswith("a=candidate")
    )
    fields = line.split()
    return fields[4], int(fields[5])


async def spoof(address: tuple[str, int], count: int) -> None:
    """Send ``count`` SRTP-looking datagrams from a socket that is not the publisher's."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
    )
    try:
        for _ in range(count):
            transport.sendto(SPOOF_MARK + os.urandom(100), address)
    finally:
        transport.close()


async def test_authenticated_media_counts_and_spoofed_datagrams_do_not(
    peers: LoopbackPeers,
) -> None:
    pair = await connect(peers, media=True, timeout_s=30, consent_interval_s=60)
    await pair.authenticated.reaches(10)
    await spoof(server_address(pair.server), SPOOFED)
    await pair.spoofed_read.reaches(SPOOFED)
    await pair.spoofed_done.reaches(SPOOFED)
    assert pair.liveness.media_packets == pair.authenticated.count
    assert pair.liveness.last_media is not None
    assert pair.liveness.last_media >= pair.liveness.started


async def test_a_consent_answer_keeps_a_mute_publisher_alive(peers: LoopbackPeers) -> None:
    timeout_s, consent_s = 0.4, 0.1
    pair = await connect(peers, media=False, timeout_s=timeout_s, consent_interval_s=consent_s)
    mute(pair.publisher)
    seen = count_consent(pair.publisher)
    answered_before = pair.liveness.consent_ok
    # Ten consent rounds take about 1 s: more than twice the timeout.
    await seen.reaches(10)
    assert pair.expired == [] and not pair.liveness.expired
    assert pair.liveness.consent_ok - answered_before >= 9
    assert pair.liveness.last_consent_ok is not None
    assert pair.server.connectionState == "connected"


async def test_media_keeps_a_publisher_that_never_answers_consent_alive(
    peers: LoopbackPeers,
) -> None:
    # Consent ignored for 2 s, twice the timeout. The timeout leaves room for the
    # publisher's media to stall: at 0.4 s a full suite's load once stopped aiortc's
    # packets for longer than that, and the peer expired after 3 ignored checks.
    timeout_s, consent_s = 1.0, 0.1
    pair = await connect(peers, media=True, timeout_s=timeout_s, consent_interval_s=consent_s)
    ignored = ignore_consent(pair.publisher)
    answered = pair.liveness.consent_ok
    media_before = pair.liveness.media_packets
    await ignored.reaches(20)
    assert pair.expired == [] and not pair.liveness.expired
    assert pair.liveness.consent_ok <= answered + 1, "at most one answer was in flight"
    assert pair.liveness.media_packets > media_before
    assert pair.server.connectionState == "connected"


async def test_silence_closes_ice_after_the_timeout(peers: LoopbackPeers) -> None:
    timeout_s = 0.3
    pair = await connect(peers, media=False, timeout_s=timeout_s, consent_interval_s=0.1)
    mute(pair.publisher)
    ignore_consent(pair.publisher)
    async with asyncio.timeout(WAIT_S):
        await pair.expired_event.wait()
    assert len(pair.expired) == 1 and pair.expired[0] > timeout_s
    assert pair.liveness.expired
    assert pair.liveness.consent_sent > pair.liveness.consent_ok
    await pair.server_states.reached("closed")
    assert pair.server_states.history == ["connecting", "connected", "closed"]


def test_a_fresh_liveness_reads_its_start_as_the_last_life() -> None:
    liveness = Liveness(timeout_s=5)
    assert liveness.last_life() == liveness.started
    liveness.last_consent_ok = liveness.started + 1
    liveness.last_media = liveness.started + 2
    assert liveness.last_life() == liveness.started + 2
