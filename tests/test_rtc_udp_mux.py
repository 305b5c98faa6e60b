"""The shared UDP port (:mod:`whip.rtc.udp_mux`, :mod:`whip.rtc.ice_sockets`) with real
aiortc publishers through the real server: candidates, routing, every close path
emptying the table, abuse and spoofing counted in ``/metrics``.

The servers run with ``ice.udp_mux = true`` whatever ``WHIP_TEST_ICE_UDP_MUX`` says, on
``ice.udp_port = 0``. The one-socket-per-process check with ten publishers is in
``tests/test_udp_mux_process.py`` (it reads a server subprocess's ``/proc``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from aioice.ice import Connection

from tests.support.eventually import eventually
from tests.support.ice_udp import (
    SRTP_LIKE,
    binding_request,
    keeps_decoding,
    live_push,
    mux_of,
    publisher_connection,
    server_connection,
    session_of,
    udp_socket,
)
from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import TIMELINE_KEY
from whip.live_session import SessionState
from whip.rtc.ice_sockets import (
    SERVER_UFRAG_LENGTH,
    IceCredentialsInUseError,
    refresh_ice_credentials,
)
from whip.rtc.session_protocol import SessionStunProtocol
from whip.rtc.udp_mux import UdpMux, UdpPortInUseError

Start = Callable[..., Awaitable[TestServer]]


@pytest.fixture
async def mux_server(whip_servers: Start) -> TestServer:
    return await whip_servers(ice__udp_mux=True, limits__reclaim_after_s=3)


async def _metrics(server: TestServer, http: aiohttp.ClientSession) -> dict[str, float]:
    """``/metrics`` samples of the ICE UDP families, keyed ``name{labels}``."""
    text = await (await http.get(server.make_url("/metrics"))).text()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("whip_ice_") and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


async def _table_empty(mux: UdpMux, what: str) -> None:
    await eventually(
        lambda: len(mux.routes) == 0 and mux.routes.learned_addresses == 0,
        within=15,
        awaiting=lambda: (
            f"the mux table empty after {what}: {len(mux.routes)} sessions, "
            f"{mux.routes.learned_addresses} addresses"
        ),
    )


def _local_candidate_ports(sdp: str) -> set[int]:
    """The ports of the answer's UDP candidates (its ICE-TCP ones are on the TCP port)."""
    return {
        int(fields[5])
        for fields in (line.split() for line in sdp.splitlines())
        if fields and fields[0].startswith("a=candidate:") and fields[2].lower() == "udp"
    }


# -- one port, end to end -------------------------------------------------------------------


async def test_a_publisher_pushes_through_the_shared_port(mux_server: TestServer) -> None:
    mux = mux_of(mux_server)
    ((host, port),) = mux.ports
    assert host == "127.0.0.1" and port > 0
    async with aiohttp.ClientSession() as http:
        ready = await (await http.get(mux_server.make_url("/readyz"))).json()
        assert ready["udp_ports"] == [port]
        publisher = AiortcPublisher()
        response = await publisher.publish(http, str(mux_server.make_url("/whip/cam")))
        assert response.status == 201
        assert _local_candidate_ports(await response.text()) == {port}
        await asyncio.wait_for(publisher.connected.wait(), 20)
        await wait_for_type(mux_server.app[TIMELINE_KEY], publisher.run_id, "first_frame")
        connection = server_connection(mux_server, publisher)
        assert len(connection.local_username) == SERVER_UFRAG_LENGTH
        assert all(isinstance(p, SessionStunProtocol) for p in connection._protocols)
        assert [p.local_candidate.port for p in connection._protocols] == [port]
        assert len(mux.routes) == 1 and mux.routes.learned_addresses >= 1
        await keeps_decoding(mux_server, publisher)
        metrics = await _metrics(mux_server, http)
        assert metrics["whip_ice_udp_sessions_registered"] == 1
        assert metrics['whip_ice_udp_datagrams_routed_total{by="learned"}'] > 0
        assert metrics['whip_ice_udp_datagrams_routed_total{by="verified"}'] > 0
        assert (await http.delete(mux_server.make_url(publisher.location))).status == 200
        await _table_empty(mux, "DELETE")
        await publisher.close()


async def test_a_publisher_in_the_same_process_keeps_its_own_socket(
    mux_server: TestServer,
) -> None:
    """Only the server's connections use the shared port: the hook tells them apart."""
    mux = mux_of(mux_server)
    ((_, port),) = mux.ports
    async with aiohttp.ClientSession() as http:
        publisher = await live_push(mux_server, http, "own-socket")
        (protocol,) = publisher_connection(publisher)._protocols
        assert not isinstance(protocol, SessionStunProtocol)
        assert protocol.transport.get_extra_info("sockname")[1] != port
        await publisher.close()


# -- every close path empties the table -------------------------------------------------------


async def test_peer_gone_and_operator_stop_unregister(mux_server: TestServer) -> None:
    mux = mux_of(mux_server)
    async with aiohttp.ClientSession() as http:
        gone = await live_push(mux_server, http, "gone")
        stopped = await live_push(mux_server, http, "stopped")
        assert len(mux.routes) == 2
        await gone.close()  # the reclaimer closes it (peer_gone)
        await wait_for_type(mux_server.app[TIMELINE_KEY], gone.run_id, "session_closed")
        await eventually(
            lambda: len(mux.routes) == 1, within=15, awaiting="the gone session unregistered"
        )
        assert (await http.post(mux_server.make_url(f"/v1/runs/{stopped.run_id}/stop"))).ok
        await _table_empty(mux, "the reclaimer and an operator stop")
        await stopped.close()


async def test_supersede_unregisters_the_old_session(mux_server: TestServer) -> None:
    mux = mux_of(mux_server)
    async with aiohttp.ClientSession() as http:
        first = await live_push(mux_server, http, "same")
        old = server_connection(mux_server, first)
        second = await live_push(mux_server, http, "same")
        events = await mux_server.app[TIMELINE_KEY].read_events(first.run_id, 0, 100)
        assert {"reason": "superseded"} in [e.data for e in events if e.type == "session_closed"]
        await eventually(
            lambda: len(mux.routes) == 1 and old not in {s.connection for s in _sessions(mux)},
            within=15,
            awaiting="only the new session registered",
        )
        await keeps_decoding(mux_server, second)
        assert (await http.delete(mux_server.make_url(second.location))).status == 200
        await _table_empty(mux, "supersede and DELETE")
        await first.close()
        await second.close()


def _sessions(mux: UdpMux) -> list[Any]:
    return list(mux._sessions.values())


async def test_a_fault_unregisters(whip_servers: Start) -> None:
    server = await whip_servers(
        ice__udp_mux=True, pipeline__processors=["tests.support.media_processors:Raiser"]
    )
    mux = mux_of(server)
    async with aiohttp.ClientSession() as http:
        publisher = AiortcPublisher()
        response = await publisher.publish(http, str(server.make_url("/whip/faulty")))
        assert response.status == 201
        closed = await wait_for_type(server.app[TIMELINE_KEY], publisher.run_id, "session_closed")
        assert closed.data == {"reason": "fault"}
        await _table_empty(mux, "a fault")
        await publisher.close()


async def test_shutdown_unregisters_then_closes_the_port(whip_servers: Start) -> None:
    server = await whip_servers(ice__udp_mux=True)
    mux = mux_of(server)
    async with aiohttp.ClientSession() as http:
        publisher = await live_push(server, http, "shutdown")
        assert len(mux.routes) == 1
        await server.close()
    assert len(mux.routes) == 0 and mux.routes.learned_addresses == 0
    assert mux.transport_of(socket.AF_INET) is None
    closed = await server.app[TIMELINE_KEY].read_events(publisher.run_id, 0, 100)
    assert {"reason": "shutdown"} in [e.data for e in closed if e.type == "session_closed"]
    await publisher.close()


async def test_closing_one_session_does_not_disturb_another(mux_server: TestServer) -> None:
    mux = mux_of(mux_server)
    async with aiohttp.ClientSession() as http:
        stays = await live_push(mux_server, http, "stays")
        leaves = await live_push(mux_server, http, "leaves")
        kept = set(mux.routes.addresses_of(_handle(mux, server_connection(mux_server, stays))))
        assert (await http.delete(mux_server.make_url(leaves.location))).status == 200
        await eventually(lambda: len(mux.routes) == 1, within=15, awaiting="one left")
        handle = _handle(mux, server_connection(mux_server, stays))
        assert kept <= set(mux.routes.addresses_of(handle))
        await keeps_decoding(mux_server, stays)
        assert session_of(mux_server, stays).lifecycle == [
            SessionState.ADMITTED,
            SessionState.CONNECTED,
        ]
        await stays.close()
        await leaves.close()


def _handle(mux: UdpMux, connection: Connection) -> Any:
    return mux._sessions[connection]


# -- abuse and spoofing ------------------------------------------------------------------------


async def test_abuse_is_dropped_counted_and_never_routed(mux_server: TestServer) -> None:
    mux = mux_of(mux_server)
    ((_, port),) = mux.ports
    target = ("127.0.0.1", port)
    async with aiohttp.ClientSession() as http:
        publisher = await live_push(mux_server, http, "victim")
        connection = server_connection(mux_server, publisher)
        ufrag = connection.local_username
        before = await _metrics(mux_server, http)
        owned = set(mux.routes.addresses_of(_handle(mux, connection)))
        stranger = udp_socket()
        try:
            sends = {
                "unknown_ufrag": binding_request("nobody-at-all:x", "p" * 22),
                "no_username": binding_request(None, "p" * 22),
                "bad_integrity": binding_request(f"{ufrag}:x", "wrong-password-of-22ch"),
                "no_integrity": binding_request(f"{ufrag}:x", None),
                "not_stun": SRTP_LIKE,
            }
            for datagram in sends.values():
                stranger.sendto(datagram, target)
            storm = 2000
            for _ in range(storm):
                stranger.sendto(SRTP_LIKE, target)

            def dropped(reason: str, samples: dict[str, float]) -> float:
                key = f'whip_ice_udp_datagrams_dropped_total{{reason="{reason}"}}'
                return samples[key] - before[key]

            async def all_counted() -> dict[str, float] | None:
                now = await _metrics(mux_server, http)
                expected = {r: 1 + (storm if r == "not_stun" else 0) for r in sends}
                got = {r: dropped(r, now) for r in sends}
                return now if got == expected else None

            await eventually(all_counted, within=15, awaiting="every abusive datagram counted")
            stranger_addr = stranger.getsockname()
            assert mux.routes.owner_of(stranger_addr) is None
            assert set(mux.routes.addresses_of(_handle(mux, connection))) == owned
            await keeps_decoding(mux_server, publisher)
            assert (await http.get(mux_server.make_url("/healthz"))).status == 200
        finally:
            stranger.close()
        await publisher.close()


async def test_another_sessions_binding_cannot_be_spoofed(mux_server: TestServer) -> None:
    """Session B's publisher, knowing A's ufrag but not its password, forges checks and
    sends SRTP from another address: A's addresses and media are untouched."""
    mux = mux_of(mux_server)
    ((_, port),) = mux.ports
    async with aiohttp.ClientSession() as http:
        a = await live_push(mux_server, http, "a")
        b = await live_push(mux_server, http, "b")
        a_conn, b_conn = server_connection(mux_server, a), server_connection(mux_server, b)
        a_owned = set(mux.routes.addresses_of(_handle(mux, a_conn)))
        spoofer = udp_socket()
        try:
            # A's ufrag signed with B's password (the only one B's publisher knows).
            forged = binding_request(f"{a_conn.local_username}:x", b_conn.local_password)
            for _ in range(20):
                spoofer.sendto(forged, ("127.0.0.1", port))
                spoofer.sendto(SRTP_LIKE, ("127.0.0.1", port))
            # From B's own learned address too: a wrong password never re-binds it.
            (b_addr,) = mux.routes.addresses_of(_handle(mux, b_conn))[-1:]
            await eventually(
                lambda: mux.routes.counters.dropped_bad_integrity >= 20,
                within=15,
                awaiting="the forged checks dropped",
            )
            assert mux.routes.owner_of(spoofer.getsockname()) is None
            assert mux.routes.owner_of(b_addr) is _handle(mux, b_conn)
            assert set(mux.routes.addresses_of(_handle(mux, a_conn))) == a_owned
            assert mux.routes.counters.addresses_rebound == 0
            await keeps_decoding(mux_server, a)
            await keeps_decoding(mux_server, b)
        finally:
            spoofer.close()
        await a.close()
        await b.close()


# -- the mux alone -------------------------------------------------------------------------------


async def test_a_colliding_ufrag_is_a_503_and_leaves_nothing_registered() -> None:
    mux = UdpMux(0)
    await mux.start(["127.0.0.1"])
    try:
        first, second = Connection(ice_controlling=False), Connection(ice_controlling=False)
        second._local_username = first.local_username
        await mux.component_candidates(first, 1, ["127.0.0.1"])
        with pytest.raises(IceCredentialsInUseError) as refused:
            await mux.component_candidates(second, 1, ["127.0.0.1"])
        assert refused.value.http_status == 503
        assert refused.value.code == "ice_credentials_in_use"
        assert len(mux.routes) == 1 and second._protocols == []
        await first.close()
        assert len(mux.routes) == 0
    finally:
        await mux.aclose()


async def test_a_taken_port_is_refused_and_port_0_falls_back_only_when_asked() -> None:
    holder = udp_socket()
    try:
        taken = holder.getsockname()[1]
        with pytest.raises(UdpPortInUseError, match=str(taken)):
            await UdpMux(taken).start(["127.0.0.1"])
        free = UdpMux(0)
        await free.start(["127.0.0.1"])
        assert free.ports[0][1] not in (0, taken)
        await free.aclose()
    finally:
        holder.close()


async def test_refreshed_credentials_route_and_the_old_ufrag_stops() -> None:
    """The call an ICE restart makes (:func:`whip.rtc.ice_sockets.refresh_ice_credentials`)."""
    mux = UdpMux(0)
    await mux.start(["127.0.0.1"])
    try:
        connection = Connection(ice_controlling=False)
        connection._whip_ice_sockets = mux  # as use_ice_sockets marks it
        await mux.component_candidates(connection, 1, ["127.0.0.1"])
        old = connection.local_username
        connection._local_username, connection._local_password = "n" * 16, "q" * 22
        refresh_ice_credentials(connection)
        stranger = ("127.0.0.1", 9)
        assert mux.routes.route(binding_request(f"{old}:x", "q" * 22), stranger)[0] is None
        handle, _ = mux.routes.route(binding_request(f"{'n' * 16}:x", "q" * 22), stranger)
        assert handle is _handle(mux, connection)
        await connection.close()
        assert len(mux.routes) == 0
    finally:
        await mux.aclose()
