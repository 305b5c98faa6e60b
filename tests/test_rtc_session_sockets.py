"""``ice.udp_mux = false`` (:mod:`whip.rtc.session_sockets`): a socket per session within
``ice.port_min..port_max``, a full range refused with 503 ``udp_ports_exhausted``, and
media from an address no STUN check verified dropped and counted, with real aiortc
publishers through the real server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually
from tests.support.ice_udp import (
    SRTP_LIKE,
    keeps_decoding,
    live_push,
    server_connection,
    session_sockets_of,
    udp_socket,
)
from tests.support.peers import AiortcPublisher
from whip.appkeys import SESSIONS_KEY
from whip.rtc.session_protocol import SessionStunProtocol

Start = Callable[..., Awaitable[TestServer]]


def _free_port() -> int:
    """A port that was free a moment ago (the range of one port the test owns)."""
    sock = udp_socket()
    port: int = sock.getsockname()[1]
    sock.close()
    return port


async def test_one_port_range_serves_one_session_then_refuses_with_503(
    whip_servers: Start,
) -> None:
    port = _free_port()
    server = await whip_servers(ice__udp_mux=False, ice__port_min=port, ice__port_max=port)
    sockets = session_sockets_of(server)
    manager = server.app[SESSIONS_KEY]
    async with aiohttp.ClientSession() as http:
        first = await live_push(server, http, "first")
        (protocol,) = server_connection(server, first)._protocols
        assert isinstance(protocol, SessionStunProtocol)
        assert protocol.local_candidate.port == port
        assert sockets.registered_sessions == 1

        refused = AiortcPublisher()
        response = await refused.publish(http, str(server.make_url("/whip/second")))
        assert response.status == 503
        assert response.headers["Retry-After"] == "5"
        assert (await response.json())["error"]["code"] == "udp_ports_exhausted"
        await refused.close()
        assert sockets.counters.ports_exhausted == 1
        assert len(manager.table) == 1 and manager.slots.reserved() == 0
        metrics = await (await http.get(server.make_url("/metrics"))).text()
        assert "whip_ice_udp_ports_exhausted_total 1.0" in metrics

        assert (await http.delete(server.make_url(first.location))).status == 200
        await eventually(
            lambda: sockets.sockets_open == 0, within=15, awaiting="the port given back"
        )
        again = await live_push(server, http, "again")
        (protocol,) = server_connection(server, again)._protocols
        assert protocol.local_candidate.port == port
        await first.close()
        await again.close()


async def test_media_from_an_unverified_address_is_dropped(whip_servers: Start) -> None:
    """aioice's own protocol hands data from any address to the session; here it is
    dropped and counted, and the session keeps decoding."""
    server = await whip_servers(ice__udp_mux=False)
    sockets = session_sockets_of(server)
    async with aiohttp.ClientSession() as http:
        publisher = await live_push(server, http, "guarded")
        (protocol,) = server_connection(server, publisher)._protocols
        target = ("127.0.0.1", protocol.local_candidate.port)
        before = sockets.route_counters.dropped_not_stun
        stranger = udp_socket()
        try:
            for _ in range(200):
                stranger.sendto(SRTP_LIKE, target)
            await eventually(
                lambda: sockets.route_counters.dropped_not_stun >= before + 200,
                within=15,
                awaiting="the stranger's media dropped",
            )
            assert protocol.routes is not None
            assert protocol.routes.owner_of(stranger.getsockname()) is None
            await keeps_decoding(server, publisher)
            metrics = await (await http.get(server.make_url("/metrics"))).text()
            assert 'whip_ice_udp_datagrams_dropped_total{reason="not_stun"}' in metrics
        finally:
            stranger.close()
        assert (await http.delete(server.make_url(publisher.location))).status == 200
        await eventually(
            lambda: sockets.registered_sessions == 0, within=15, awaiting="the socket closed"
        )
        await publisher.close()
