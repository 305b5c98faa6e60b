"""How a peer ended (``whip/rtc/peer_end.py``), with real aiortc publishers on loopback.

A publisher that says goodbye (RTCP BYE on each source, DTLS close_notify, or both as
``pc.close()`` sends them) before its DELETE closes the session as ``peer_closed``; the
DELETE that follows is 200 from the tombstone. A publisher that just goes quiet (its
sockets closed under it: no BYE, no close_notify) is ``peer_gone`` once
``limits.reclaim_after_s`` passed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.rtc.ice_restart import bundle_ice_transport, ice_connection
from whip.rtc.peer import dtls_transports
from whip.rtc.peer_end import CLOSE_NOTIFY, RTCP_BYE
from whip.session_manager import SessionManager

pytestmark = pytest.mark.timeout(60)


async def _push(
    server: TestServer, http: aiohttp.ClientSession
) -> tuple[AiortcPublisher, LiveSession]:
    publisher = AiortcPublisher()
    response = await publisher.publish(http, str(server.make_url("/whip")))
    assert response.status == 201
    (session,) = server.app[SESSIONS_KEY].table.live()
    await wait_for_type(server.app[TIMELINE_KEY], publisher.run_id, "first_frame")
    return publisher, session


async def _ended(server: TestServer, publisher: AiortcPublisher) -> str:
    closed = await wait_for_type(
        server.app[TIMELINE_KEY], publisher.run_id, "session_closed", wait_s=30
    )
    return str(closed.data["reason"])


async def _pc_close(publisher: AiortcPublisher) -> None:
    await publisher.pc.close()


async def _close_notify_only(publisher: AiortcPublisher) -> None:
    for dtls in dtls_transports(publisher.pc):
        await dtls.stop()  # close_notify; the senders are left as they were


async def _bye_only(publisher: AiortcPublisher) -> None:
    for transceiver in publisher.pc.getTransceivers():
        await transceiver.sender.stop()  # the RTCP loop's last word is a BYE


@pytest.mark.parametrize(
    ("goodbye", "reasons"),
    [
        (_pc_close, {RTCP_BYE, CLOSE_NOTIFY}),
        (_close_notify_only, {CLOSE_NOTIFY}),
        (_bye_only, {RTCP_BYE}),
    ],
    ids=["pc_close", "close_notify", "rtcp_bye"],
)
async def test_a_peer_that_says_goodbye_before_delete_is_peer_closed(
    whip_servers: Callable[..., Awaitable[TestServer]],
    goodbye: Callable[[AiortcPublisher], Awaitable[None]],
    reasons: set[str],
) -> None:
    server = await whip_servers(limits__reclaim_after_s=30)
    manager: SessionManager = server.app[SESSIONS_KEY]
    async with aiohttp.ClientSession() as http:
        publisher, session = await _push(server, http)
        await goodbye(publisher)
        assert await _ended(server, publisher) == "peer_closed"
        assert session.peer_end is not None and session.peer_end.reason in reasons
        deleted = await http.delete(server.make_url(publisher.location))
        assert deleted.status == 200  # the tombstone: idempotent
        metrics = await (await http.get(server.make_url("/metrics"))).text()
        assert 'whip_sessions_closed_total{reason="peer_closed"} 1.0' in metrics
        assert 'whip_sessions_closed_total{reason="peer_gone"} 0.0' in metrics
    await publisher.close()
    assert len(manager.table) == 0 and manager.budget.figures().bytes_reserved == 0


async def test_a_peer_that_goes_quiet_is_peer_gone(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers(limits__reclaim_after_s=2)
    async with aiohttp.ClientSession() as http:
        publisher, session = await _push(server, http)
        for protocol in ice_connection(bundle_ice_transport(publisher.pc))._protocols:
            protocol.transport.close()  # nothing more leaves the publisher, not even a BYE
        assert await _ended(server, publisher) == "peer_gone"
        assert session.peer_end is not None and session.peer_end.reason is None
    await publisher.close()
