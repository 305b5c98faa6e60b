"""ICE-TCP (whip/rtc/ice_tcp.py): a real browser whose UDP is blocked publishes over the one
TCP port; hostile raw connections are closed and counted while the server and the other
sessions carry on.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import aioice
import aioice.candidate
import aioice.stun
from aiohttp.test_utils import TestServer

from bench.support.server_process import free_port
from registry.timeline import Timeline
from tests.support.chromium import UDP_BLOCKED_FLAGS, ChromiumPage
from tests.support.eventually import eventually
from tests.support.ice_tcp_client import (
    binding_request,
    closed_by_server,
    connected,
    frame,
    read_frame,
    split_frames,
)
from tests.support.peers import AiortcPublisher
from tests.support.servers import serve_argv, wait_for_type
from whip.appkeys import ICE_TCP_KEY, SESSIONS_KEY, TIMELINE_KEY
from whip.cli import EXIT_PORT_IN_USE
from whip.rtc.ice_tcp import IceTcpLimits, IceTcpListener
from whip.rtc.ice_tcp_sessions import TcpRefusal

Launch = Callable[..., Awaitable[ChromiumPage]]
Servers = Callable[..., Awaitable[TestServer]]


def _candidates(sdp: str) -> list[list[str]]:
    return [line.split()[1:] for line in sdp.splitlines() if line.startswith("a=candidate:")]


def _selected_pair(
    server: TestServer, session_id: str
) -> tuple[aioice.Candidate, aioice.Candidate] | None:
    """The server's nominated pair of the session: (local candidate, remote candidate)."""
    session = server.app[SESSIONS_KEY].table.get(session_id)
    if session is None:
        return None
    transceiver = session.pc.getTransceivers()[0]
    connection = transceiver.receiver.transport.transport._connection
    pair = connection._nominated.get(1)
    return None if pair is None else (pair.local_candidate, pair.remote_candidate)


async def test_chromium_with_udp_blocked_publishes_over_ice_tcp(
    whip_servers: Servers, chromium: Launch
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    listener: IceTcpListener = server.app[ICE_TCP_KEY]
    page = await chromium(*UDP_BLOCKED_FLAGS)
    endpoint = str(server.make_url("/whip/tcp"))

    assert await page.evaluate(f"whipPublish({endpoint!r}, {{videoCodec: 'video/VP8'}})") == 201
    state = await page.evaluate("window.whip")
    offered = _candidates(state["offer"])
    assert not [c for c in offered if c[1].lower() == "udp"], offered
    answered = _candidates(state["answer"])
    tcp = [c for c in answered if c[1] == "tcp"]
    udp = [c for c in answered if c[1] == "udp"]
    assert tcp and udp
    assert all(c[4] == str(listener.port) and c[-2:] == ["tcptype", "passive"] for c in tcp)
    assert max(int(c[2]) for c in tcp) < min(int(c[2]) for c in udp)

    run_id: str = state["runId"]
    first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
    assert first.data["codec"] == "VP8"
    session_id = state["location"].rsplit("/", 1)[1]
    pair = _selected_pair(server, session_id)
    assert pair is not None
    local, remote = pair
    assert (local.transport, local.tcptype, local.port) == ("tcp", "passive", listener.port)
    assert (remote.transport, remote.type) == ("tcp", "prflx")

    async def browser_selected() -> dict[str, Any] | None:
        selected: dict[str, Any] | None = await page.evaluate("whipSelectedPair()")
        return selected

    browser_pair = await eventually(browser_selected, within=10, awaiting="the browser's pair")
    assert browser_pair["local"]["protocol"] == "tcp"
    assert browser_pair["remote"]["port"] == listener.port

    async def decoded_past(count: int) -> bool:
        events = await timeline.read_events(run_id, 0, limit=1000)
        return any(e.type == "stats" and e.data["frames_decoded"] > count for e in events)

    await eventually(lambda: decoded_past(30), within=30, awaiting="30 frames decoded")
    assert listener.counters.bound >= 1
    assert await page.evaluate("whipStop()") == 200
    closed = await wait_for_type(timeline, run_id, "session_closed")
    assert closed.data["reason"] == "deleted"
    await eventually(
        lambda: listener.registered == 0 and listener.open_connections == 0,
        within=10,
        awaiting="the session unregistered and its TCP connection closed",
    )


# -- raw sockets ----------------------------------------------------------------------


def _ice_credentials(server: TestServer, run_id: str) -> tuple[str, str, str]:
    """The server's ufrag and password of a run's session, and the publisher's ufrag."""
    session = server.app[SESSIONS_KEY].find_by_run(run_id)
    assert session is not None
    connection = session.pc.getTransceivers()[0].receiver.transport.transport._connection
    return connection.local_username, connection.local_password, connection.remote_username


async def _frames_decoded(timeline: Timeline, run_id: str) -> int:
    events = await timeline.read_events(run_id, 0, limit=1000)
    return max([e.data["frames_decoded"] for e in events if e.type == "stats"], default=0)


async def test_hostile_connections_are_closed_and_counted_and_sessions_carry_on(
    whip_servers: Servers,
) -> None:
    server = await whip_servers(
        pipeline__stats_interval_s=0.5,
        ice__tcp_handshake_timeout_s=0.5,
        ice__tcp_max_connections_per_address=3,
    )
    timeline: Timeline = server.app[TIMELINE_KEY]
    listener: IceTcpListener = server.app[ICE_TCP_KEY]
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        try:
            response = await publisher.publish(http, str(server.make_url("/whip/udp")))
            assert response.status == 201
            await wait_for_type(timeline, publisher.run_id, "first_frame", wait_s=30)
            ufrag, password, remote_ufrag = _ice_credentials(server, publisher.run_id)
            decoded_before = await _frames_decoded(timeline, publisher.run_id)

            async def attempt(payload: bytes) -> bytes:
                async with connected(listener.port) as (reader, writer):
                    writer.write(payload)
                    return await closed_by_server(reader)

            username = f"{ufrag}:{remote_ufrag}"
            cases = {
                TcpRefusal.NOT_STUN: frame(b"\x17\xfe\xfd" + bytes(60)),  # DTLS-looking
                TcpRefusal.OVERSIZE_FRAME: b"\xff\xff" + bytes(100),
                TcpRefusal.BAD_INTEGRITY: frame(binding_request(username, b"wrong password")),
                TcpRefusal.NO_INTEGRITY: frame(binding_request(username, None)),
                TcpRefusal.UNKNOWN_UFRAG: frame(
                    binding_request(f"nobody:{remote_ufrag}", password.encode())
                ),
                TcpRefusal.WRONG_REMOTE_UFRAG: frame(
                    binding_request(f"{ufrag}:someone", password.encode())
                ),
                TcpRefusal.HANDSHAKE_TIMEOUT: b"",  # connects, then says nothing
            }
            for reason, payload in cases.items():
                assert await attempt(payload) == b"", reason  # not one byte answered
            assert {r: listener.counters.refused[r] for r in cases} == dict.fromkeys(cases, 1)
            assert listener.counters.bound == 0

            # The cap per address: three silent connections held open, the fourth refused.
            held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(3)]
            await eventually(
                lambda: listener.open_connections == 3, within=10, awaiting="3 held connections"
            )
            assert await attempt(b"") == b""
            assert listener.counters.refused[TcpRefusal.ADDRESS_CAP] == 1
            for _reader, writer in held:
                writer.close()
            await eventually(
                lambda: listener.open_connections == 0, within=10, awaiting="the held ones closed"
            )

            # Nothing of it reached the session: it still decodes, the server is healthy.

            async def decoding_on() -> bool:
                return await _frames_decoded(timeline, publisher.run_id) > decoded_before + 15

            await eventually(decoding_on, within=20, awaiting="more frames decoded")
            assert publisher.states[-1] == "connected"
            assert (await http.get(server.make_url("/healthz"))).status == 200
            metrics = await (await http.get(server.make_url("/metrics"))).text()
            assert 'whip_ice_tcp_connections_refused_total{reason="bad_integrity"} 1.0' in metrics
            assert f"whip_ice_tcp_port {float(listener.port)}" in metrics
            ready = await (await http.get(server.make_url("/readyz"))).json()
            assert ready["ice_tcp_port"] == listener.port
        finally:
            await publisher.close()


async def test_a_verified_binding_request_binds_the_connection_and_is_answered_framed(
    whip_servers: Servers,
) -> None:
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    listener: IceTcpListener = server.app[ICE_TCP_KEY]
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        try:
            response = await publisher.publish(http, str(server.make_url("/whip/udp")))
            assert response.status == 201
            await wait_for_type(timeline, publisher.run_id, "first_frame", wait_s=30)
            ufrag, password, remote_ufrag = _ice_credentials(server, publisher.run_id)

            async with connected(listener.port) as (reader, writer):
                request = binding_request(f"{ufrag}:{remote_ufrag}", password.encode())
                writer.write(frame(request))
                answer = aioice.stun.parse_message(await read_frame(reader))
                assert answer.message_class == aioice.stun.Class.RESPONSE
                assert answer.transaction_id == request[8:20]
                assert answer.attributes["XOR-MAPPED-ADDRESS"] == writer.get_extra_info("sockname")
                assert listener.counters.bound == 1
                # Bound, the limit is ice.tcp_max_frame_bytes (1500): one byte more closes it.
                writer.write(b"\x05\xdd" + bytes(1501))
                after = await closed_by_server(reader)
            # What came meanwhile is the server's own triggered check, framed, nothing else.
            for payload in split_frames(after):
                check = aioice.stun.parse_message(payload)
                assert check.message_class == aioice.stun.Class.REQUEST
                assert check.attributes["USERNAME"] == f"{remote_ufrag}:{ufrag}"
            assert listener.counters.refused[TcpRefusal.OVERSIZE_FRAME] == 1
            await eventually(
                lambda: listener.open_connections == 0, within=10, awaiting="the close"
            )
            assert publisher.states[-1] == "connected"  # its UDP pair is untouched

            assert (await http.delete(server.make_url(publisher.location))).status == 200
            await eventually(
                lambda: listener.registered == 0, within=10, awaiting="unregistered at close"
            )
        finally:
            await publisher.close()


async def test_connections_past_the_total_cap_are_refused_at_once(whip_servers: Servers) -> None:
    server = await whip_servers(ice__tcp_max_connections=2, ice__tcp_handshake_timeout_s=30)
    listener: IceTcpListener = server.app[ICE_TCP_KEY]
    held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(2)]
    try:
        await eventually(
            lambda: listener.open_connections == 2, within=10, awaiting="2 held connections"
        )
        async with connected(listener.port) as (reader, _writer):
            assert await closed_by_server(reader) == b""  # long before the 30 s handshake
        assert listener.counters.refused[TcpRefusal.TOTAL_CAP] == 1
        assert listener.open_connections == 2
    finally:
        for _reader, held_writer in held:
            held_writer.close()
    await eventually(lambda: listener.open_connections == 0, within=10, awaiting="all closed")


# -- the start --------------------------------------------------------------------------


async def test_candidates_name_the_gathered_addresses_then_the_public_hosts() -> None:
    listener = IceTcpListener(
        IceTcpLimits(), public_hosts=["198.51.100.7"], host_addresses=lambda: ["127.0.0.1"]
    )
    assert listener.local_candidates(1) == []  # not listening yet
    await listener.start("127.0.0.1", 0)
    try:
        candidates = listener.local_candidates(1)
        assert [(c.host, c.port, c.tcptype) for c in candidates] == [
            ("127.0.0.1", listener.port, "passive"),
            ("198.51.100.7", listener.port, "passive"),
        ]
    finally:
        await listener.close()


def test_serve_refuses_to_start_when_the_tcp_port_is_taken(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = serve_argv(free_port(), tmp_path / "data", "--tcp-port", str(port))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == EXIT_PORT_IN_USE, done.stderr
    assert f"cannot start: ice.tcp_port {port}: cannot listen" in done.stderr
    assert "Traceback" not in done.stderr
