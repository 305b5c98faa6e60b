"""The publisher's half of an ICE restart over WHIP PATCH, for aiortc publishers in tests.

aiortc has no ``restartIce()``: the publisher's new generation is made on its own aioice
connection with the production :func:`whip.rtc.ice_restart.restart_ice` (the publisher is
the controlling agent, the server the controlled one). The PATCH carries fresh
credentials and the publisher's candidates under ``If-Match: "*"``; the new credentials
are installed on the publisher's side only once the server's answer is there (RFC 9725:
the client applies the answer of its last request), together with the server's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import aiohttp
from aioice import Candidate

from tests.support.peers import AiortcPublisher
from whip.rtc.ice_restart import IceRestart, RemoteIce, bundle_ice_transport, restart_ice
from whip.trickle import (
    CONTENT_TYPE,
    IceCredentials,
    TrickleFragment,
    answer_layout,
    parse_fragment,
    render_fragment,
)


@dataclass(frozen=True, slots=True)
class ClientRestart:
    """What one client-side restart sent and got."""

    status: int
    etag: str | None
    answer: TrickleFragment | None
    """The server's fragment (on 200)."""
    restart: IceRestart | None
    """The publisher's running restart (on 200)."""
    local: IceCredentials


async def restart_publisher_ice(
    publisher: AiortcPublisher,
    http: aiohttp.ClientSession,
    session_url: str,
    *,
    send_candidates: bool = True,
) -> ClientRestart:
    """PATCH a restart for ``publisher`` and, on 200, restart its ICE with the answer.
    Without ``send_candidates`` the fragment names none (only ``a=end-of-candidates``, as
    a client whose gathering had not begun sends): the server learns the publisher as
    peer-reflexive from its checks.

    Cancellation: a PATCH in flight is abandoned; the publisher's ICE is unchanged unless
    the answer was already applied."""
    transport = bundle_ice_transport(publisher.pc)
    local = IceCredentials.generate()
    offer_layout = answer_layout(publisher.pc.localDescription.sdp)
    if not send_candidates:
        offer_layout = replace(offer_layout, candidates=())
    response = await http.patch(
        session_url,
        data=render_fragment(local, offer_layout),
        headers={"Content-Type": CONTENT_TYPE, "If-Match": "*"},
    )
    body = await response.read()
    if response.status != 200:
        return ClientRestart(response.status, response.headers.get("ETag"), None, None, local)
    answer = parse_fragment(body)
    assert answer.ice_ufrag is not None and answer.ice_pwd is not None
    remote = RemoteIce(
        IceCredentials(answer.ice_ufrag, answer.ice_pwd),
        tuple(Candidate.from_sdp(c.removeprefix("candidate:")) for c in answer.candidates),
        answer.end_of_candidates,
    )
    restart = restart_ice(transport, local, remote)
    return ClientRestart(200, response.headers.get("ETag"), answer, restart, local)
