"""NAT rebinding (:mod:`whip.rtc.session_protocol`): a real aiortc publisher moves to a
new local port mid-push, with no ICE restart and nothing said to the server. Its
consent checks from the new address verify, aioice checks the new pair back, the
server's selected pair follows the media, and frames keep being decoded: one run, one
session. With the mux on and off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually
from tests.support.ice_udp import (
    SRTP_LIKE,
    keeps_decoding,
    live_push,
    move_to_new_port,
    server_connection,
    session_of,
    udp_socket,
)
from tests.support.peers import AiortcPublisher
from whip.appkeys import ICE_SOCKETS_KEY, SESSIONS_KEY, TIMELINE_KEY
from whip.rtc.udp_mux import UdpMux

Start = Callable[..., Awaitable[TestServer]]


def _selected_remote(server: TestServer, publisher: AiortcPublisher) -> tuple[str, int]:
    connection = server_connection(server, publisher)
    address: tuple[str, int] = connection._nominated[1].remote_addr
    return address


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "no-mux"])
async def test_a_publisher_that_moves_port_is_followed(whip_servers: Start, mux: bool) -> None:
    server = await whip_servers(ice__udp_mux=mux, limits__reclaim_after_s=20)
    sockets = server.app[ICE_SOCKETS_KEY]
    manager = server.app[SESSIONS_KEY]
    async with aiohttp.ClientSession() as http:
        publisher = await live_push(server, http, "roaming")
        session = session_of(server, publisher)
        old = _selected_remote(server, publisher)
        new = await move_to_new_port(publisher)
        assert new != old

        await eventually(
            lambda: _selected_remote(server, publisher) == new,
            within=20,
            awaiting=lambda: (
                f"the selected pair moved {old} -> {new}, now {_selected_remote(server, publisher)}"
            ),
        )
        assert sockets.counters.selected_pair_moves == 1
        await keeps_decoding(server, publisher, more=30)
        assert session_of(server, publisher) is session
        assert len(manager.table) == 1
        events = await server.app[TIMELINE_KEY].read_events(publisher.run_id, 0, 1000)
        assert [e.type for e in events if e.type in ("run_created", "session_closed")] == [
            "run_created"
        ]
        assert (await http.delete(server.make_url(publisher.location))).status == 200
        await publisher.close()


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "no-mux"])
async def test_media_from_an_unverified_new_address_moves_nothing(
    whip_servers: Start, mux: bool
) -> None:
    """SRTP from an address that never passed a check is dropped: the selected pair
    stays and nothing is learned."""
    server = await whip_servers(ice__udp_mux=mux)
    sockets = server.app[ICE_SOCKETS_KEY]
    async with aiohttp.ClientSession() as http:
        publisher = await live_push(server, http, "steady")
        old = _selected_remote(server, publisher)
        (protocol,) = server_connection(server, publisher)._protocols
        target = ("127.0.0.1", protocol.local_candidate.port)
        impostor = udp_socket()
        try:
            for _ in range(100):
                impostor.sendto(SRTP_LIKE, target)
            counters = (
                sockets.routes.counters if isinstance(sockets, UdpMux) else sockets.route_counters
            )
            await eventually(
                lambda: counters.dropped_not_stun >= 100,
                within=15,
                awaiting="the impostor's datagrams dropped",
            )
            assert _selected_remote(server, publisher) == old
            assert sockets.counters.selected_pair_moves == 0
            await keeps_decoding(server, publisher)
        finally:
            impostor.close()
        await publisher.close()
