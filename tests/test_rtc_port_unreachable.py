"""The ICMP port unreachable a session's end sends on the shared UDP port
(``whip/rtc/port_unreachable.py``): the messages as built, what a real kernel does with
them (a connected UDP socket fails, an unconnected one does not notice), and FFmpeg's
WHIP muxer, which without them hangs after the server stops its run.

The kernel and FFmpeg tests need a raw socket (root or ``CAP_NET_RAW``): without one they
skip and say so, except under ``CI=true``, where they fail (CI runs as root).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.servers import wait_for_type
from whip.appkeys import ICE_SOCKETS_KEY, SESSIONS_KEY, TIMELINE_KEY
from whip.rtc.port_unreachable import (
    PortUnreachable,
    _checksum,
    icmp4_port_unreachable,
    icmp6_port_unreachable,
)
from whip.rtc.udp_mux import UdpMux

ROOT = Path(__file__).resolve().parent.parent
PUSH_S = 30.0
"""The FFmpeg push's own length: far longer than the test waits for it to end."""
ENDS_WITHIN_S = 20.0


@pytest.fixture
def unreachable() -> Iterator[PortUnreachable]:
    sender = PortUnreachable()
    if not sender.available(socket.AF_INET):
        message = "no raw socket (needs root or CAP_NET_RAW)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: never skipped)")
        pytest.skip(message)
    yield sender
    sender.close()


def test_the_ipv4_message_quotes_a_datagram_from_the_publisher_to_the_server() -> None:
    message = icmp4_port_unreachable(("192.0.2.7", 50123), ("198.51.100.1", 8189))
    assert message[:2] == bytes([3, 3])  # destination unreachable, port unreachable
    assert _checksum(message) == 0  # the ICMP checksum is right
    quoted_ip, quoted_udp = message[8:28], message[28:]
    assert _checksum(quoted_ip) == 0  # so is the quoted header's
    assert quoted_ip[0] == 0x45 and quoted_ip[9] == 17  # IPv4, UDP
    assert socket.inet_ntoa(quoted_ip[12:16]) == "192.0.2.7"
    assert socket.inet_ntoa(quoted_ip[16:20]) == "198.51.100.1"
    assert struct.unpack("!HHHH", quoted_udp) == (50123, 8189, 8, 0)


def test_the_ipv6_message_quotes_a_datagram_from_the_publisher_to_the_server() -> None:
    message = icmp6_port_unreachable(("2001:db8::7", 50123), ("fe80::1%eth0", 8189))
    assert message[:2] == bytes([1, 4])  # destination unreachable, port unreachable
    quoted_ip, quoted_udp = message[8:48], message[48:]
    assert quoted_ip[0] >> 4 == 6 and quoted_ip[6] == 17
    assert socket.inet_ntop(socket.AF_INET6, quoted_ip[8:24]) == "2001:db8::7"
    assert socket.inet_ntop(socket.AF_INET6, quoted_ip[24:40]) == "fe80::1"
    assert struct.unpack("!HHHH", quoted_udp) == (50123, 8189, 8, 0)


def test_a_connected_socket_fails_and_an_unconnected_one_does_not_notice(
    unreachable: PortUnreachable,
) -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as connected,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unconnected,
    ):
        server.bind(("127.0.0.1", 0))
        server_addr = server.getsockname()
        connected.connect(server_addr)  # as FFmpeg's WHIP muxer does
        unconnected.bind(("127.0.0.1", 0))  # as libwebrtc, libdatachannel and aioice do
        for sock in (connected, unconnected):
            sock.settimeout(5)
        publishers = [connected.getsockname(), unconnected.getsockname()]
        assert unreachable.send(publishers, [server_addr]) == 2
        with pytest.raises(ConnectionRefusedError):
            connected.recv(100)
        # The unconnected socket still works: the next datagram for it arrives.
        server.sendto(b"still here", unconnected.getsockname())
        assert unreachable.send([unconnected.getsockname()], [server_addr]) == 1
        server.sendto(b"and here", unconnected.getsockname())
        assert unconnected.recv(100) == b"still here"
        assert unconnected.recv(100) == b"and here"
    assert (unreachable.sent, unreachable.failed) == (3, 0)


async def test_ffmpeg_stopped_by_the_operator_on_the_shared_port_ends_its_push(
    whip_servers: Callable[..., Awaitable[TestServer]], unreachable: PortUnreachable
) -> None:
    server = await whip_servers()
    mux = server.app[ICE_SOCKETS_KEY]
    assert isinstance(mux, UdpMux)
    timeline: Timeline = server.app[TIMELINE_KEY]
    url = str(server.make_url("/whip/ffmpeg-stopped"))
    pusher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.publisher_proc",
        "--kind",
        "ffmpeg",
        url,
        str(PUSH_S),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert pusher.stdout is not None
        line = await asyncio.wait_for(pusher.stdout.readline(), 60)
        assert line.strip() == b"connected"
        manager = server.app[SESSIONS_KEY]
        session = await eventually(
            lambda: next(iter(manager.table.live()), None),
            within=30,
            awaiting="the FFmpeg session",
        )
        await wait_for_type(timeline, session.run_id, "first_frame", 30)
        async with aiohttp.ClientSession() as http:
            stop = server.make_url(f"/v1/runs/{session.run_id}/stop")
            async with http.post(stop) as answer:
                assert answer.status == 200
        closed = await wait_for_type(timeline, session.run_id, "session_closed", 30)
        assert closed.data == {"reason": "stopped"}
        # Without the ICMP message FFmpeg blocks for good here (docs/INTEROP.md).
        _, stderr = await asyncio.wait_for(pusher.communicate(), ENDS_WITHIN_S)
        assert pusher.returncode != 0
        assert b"ConnectionRefusedError" in stderr, stderr[-2000:]
        assert mux.unreachable.sent >= 1 and mux.unreachable.failed == 0
    finally:
        if pusher.returncode is None:
            pusher.kill()
            await pusher.wait()
