"""DTLS with RSA and ECDSA publisher certificates, in both DTLS roles (docs/INTEROP.md 3).

In DTLS 1.2 the cipher suite authenticates the DTLS *server's* certificate. When the
ingest is the DTLS client (it answers ``a=setup:active``) and the publisher holds an RSA
key, the ingest must offer ECDHE-RSA suites; stock aiortc offers ECDHE-ECDSA only, which
is what :class:`whip.rtc.certificate.WideCipherCertificate` fixes. When the ingest is the DTLS
server (it answers ``a=setup:passive``), its own ECDSA certificate picks the suite and the
publisher's RSA certificate only signs CertificateVerify.

The publishers are real aiortc peers over loopback UDP against the real aiohttp server.
The offer's ``a=setup`` is rewritten to choose the roles: ``actpass`` (aiortc's own) and
``passive`` make the server answer ``active`` (server = DTLS client, publisher = DTLS
server); ``active`` makes it answer ``passive`` (server = DTLS server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate, generate_certificate
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from registry.timeline import Timeline
from tests.support.peers import AiortcPublisher, server_dtls
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.negotiation import Negotiator
from whip.rtc.certificate import WideCipherCertificate, use_wide_certificate
from whip.session_manager import SessionManager, SessionSeams

PUBLISHER_SUITES = (
    b"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:"
    b"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:ECDHE-RSA-AES256-GCM-SHA384"
)
"""What a GStreamer/OpenSSL publisher can negotiate: both key types."""

CONNECT_WAIT_S = 20.0

# offer a=setup -> (the server's answer a=setup, the server's DTLS role)
SERVER_SIDE = {
    "actpass": ("active", "client"),
    "passive": ("active", "client"),
    "active": ("passive", "server"),
}

MEDIA_EVENTS = frozenset({"first_frame", "stats", "scene_change", "audio_silence", "video_black"})
"""Events the pipeline adds while media flows; lifecycle assertions skip them."""


class PublisherCertificate(RTCCertificate):
    """A publisher certificate (any key type) whose DTLS context can also serve
    ECDHE-RSA suites: without that an RSA publisher could never be a DTLS server."""

    def _create_ssl_context(self, srtp_profiles: Any) -> Any:
        context = super()._create_ssl_context(srtp_profiles)
        context.set_cipher_list(PUBLISHER_SUITES)
        return context


def publisher_certificate(kind: str) -> RTCCertificate:
    """RSA-2048 or ECDSA P-256, self-signed the way aiortc signs its own."""
    if kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return PublisherCertificate(key=key, cert=generate_certificate(key))  # type: ignore[arg-type]
    return PublisherCertificate.generateCertificate()


@pytest.fixture
def ingest(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> Callable[..., Awaitable[TestServer]]:
    """Real servers on 127.0.0.1 (the shared ``whip_servers`` fixture)."""
    return whip_servers


@dataclass
class Push:
    """One publisher's POST, as the server saw it right after the 201."""

    publisher: AiortcPublisher
    status: int
    answer: str
    session: LiveSession | None
    settled: asyncio.Event
    """Set once the publisher's connection is connected, failed or closed."""

    async def wait_settled(self) -> str:
        """The publisher's state once it stops connecting (bounded)."""
        await asyncio.wait_for(self.settled.wait(), CONNECT_WAIT_S)
        return str(self.publisher.pc.connectionState)


async def push(
    http: aiohttp.ClientSession,
    server: TestServer,
    cert_kind: str,
    offer_setup: str,
) -> Push:
    """Offer with a ``cert_kind`` certificate and ``a=setup:offer_setup``; POST; apply."""
    publisher = AiortcPublisher()
    # Before any transceiver exists: each DTLS transport copies the pc's certificate.
    publisher.pc._RTCPeerConnection__certificates = [  # type: ignore[attr-defined]
        publisher_certificate(cert_kind)
    ]
    settled = asyncio.Event()

    @publisher.pc.on("connectionstatechange")
    def on_change() -> None:
        if publisher.pc.connectionState in ("connected", "failed", "closed"):
            settled.set()

    offer = await publisher.offer()
    assert offer.count("a=setup:actpass") == 2, "aiortc offers actpass on both m-lines"
    offer = offer.replace("a=setup:actpass", f"a=setup:{offer_setup}")
    response = await http.post(
        server.make_url("/whip"), data=offer, headers={"Content-Type": "application/sdp"}
    )
    answer = await response.text()
    session = None
    if response.status == 201:
        publisher.location = response.headers["Location"]
        publisher.run_id = response.headers["X-Run-Id"]
        manager: SessionManager = server.app[SESSIONS_KEY]
        # Nothing can have connected yet: the publisher has not seen the answer.
        session = manager.table.get(publisher.location.rsplit("/", 1)[1])
        await publisher.answer(answer)
    return Push(publisher, response.status, answer, session, settled)


async def event_log(timeline: Timeline, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in await timeline.read_events(run_id, 0, 1000)]


def local_certificate(dtls: Any) -> RTCCertificate:
    """The certificate the transport copied from its peer connection at creation."""
    certificate: RTCCertificate = dtls._RTCDtlsTransport__local_certificate
    return certificate


@pytest.mark.parametrize("offer_setup", ["actpass", "passive", "active"])
@pytest.mark.parametrize("cert_kind", ["rsa", "ecdsa"])
async def test_publisher_certificate_and_dtls_role(
    ingest: Callable[..., Awaitable[TestServer]], cert_kind: str, offer_setup: str
) -> None:
    server = await ingest()
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    answer_setup, server_role = SERVER_SIDE[offer_setup]
    async with aiohttp.ClientSession() as http:
        pushed = await push(http, server, cert_kind, offer_setup)
        publisher = pushed.publisher
        try:
            assert pushed.status == 201, pushed.answer
            assert f"a=setup:{answer_setup}" in pushed.answer
            assert "a=setup:actpass" not in pushed.answer
            assert await pushed.wait_settled() == "connected", publisher.states
            await wait_for_type(timeline, publisher.run_id, "session_connected", CONNECT_WAIT_S)
            assert publisher.states == ["connecting", "connected"]

            session = pushed.session
            assert session is not None and session.connected
            dtls = server_dtls(session)
            assert isinstance(local_certificate(dtls), WideCipherCertificate)
            assert dtls._role == server_role
            assert dtls.state == "connected"
            peer_key = dtls._ssl.get_peer_certificate(as_cryptography=True).public_key()
            expected_key = rsa.RSAPublicKey if cert_kind == "rsa" else ec.EllipticCurvePublicKey
            assert isinstance(peer_key, expected_key)
            # The suite authenticates the DTLS server's key: the publisher's when the
            # server is the DTLS client, the server's own ECDSA key otherwise.
            suite_key = cert_kind if server_role == "client" else "ecdsa"
            cipher = dtls._ssl.get_cipher_name()
            assert cipher.startswith("ECDHE-RSA-" if suite_key == "rsa" else "ECDHE-ECDSA-"), cipher
            assert dtls._ssl.get_protocol_version_name() == "DTLSv1.2"

            deleted = await http.delete(server.make_url(publisher.location))
            assert deleted.status == 200
        finally:
            await publisher.close()
    events = await event_log(timeline, publisher.run_id)
    assert [t for t, _ in events if t not in MEDIA_EVENTS] == [
        "run_created",
        "session_connected",
        "session_closed",
    ]
    assert events[-1][1] == {"reason": "deleted"}
    assert len(manager.table) == 0
    assert manager.budget.figures().bytes_reserved == 0


@pytest.mark.parametrize(
    ("offer_setup", "connects"),
    [("actpass", False), ("active", True)],
    ids=["server-is-dtls-client-fails", "server-is-dtls-server-connects"],
)
async def test_stock_certificate_cannot_serve_rsa_publisher_as_dtls_client(
    ingest: Callable[..., Awaitable[TestServer]],
    offer_setup: str,
    connects: bool,
) -> None:
    """Fault injection: the server keeps aiortc's stock certificate (ECDHE-ECDSA only).

    The negotiator's ``prepare_certificate`` is a no-op in this test only, to prove the
    matrix above can fail: as DTLS client the server then offers no suite an RSA server
    can use, so the handshake fails and the reclaimer ends the session as ``peer_gone``.
    As DTLS server it still connects (its own ECDSA key picks the suite).
    """

    # Fault injection, this test only: the server's pcs keep aiortc's stock certificate.
    class StockCertificateNegotiator(Negotiator):
        def prepare_certificate(self, pc: RTCPeerConnection) -> None:
            return None

    server = await ingest(seams=SessionSeams(negotiator=StockCertificateNegotiator))
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    async with aiohttp.ClientSession() as http:
        pushed = await push(http, server, "rsa", offer_setup)
        publisher = pushed.publisher
        try:
            assert pushed.status == 201, pushed.answer
            assert pushed.session is not None
            assert type(local_certificate(server_dtls(pushed.session))) is RTCCertificate
            if connects:
                assert await pushed.wait_settled() == "connected", publisher.states
                await wait_for_type(timeline, publisher.run_id, "session_connected", CONNECT_WAIT_S)
                deleted = await http.delete(server.make_url(publisher.location))
                assert deleted.status == 200
            else:
                await wait_for_type(timeline, publisher.run_id, "session_closed", CONNECT_WAIT_S)
                assert await pushed.wait_settled() == "failed", publisher.states
                assert "connected" not in pushed.session.state_history
                assert pushed.session.state_history[-2:] == ["failed", "closed"]
        finally:
            await publisher.close()
    events = await event_log(timeline, publisher.run_id)
    if connects:
        assert [t for t, _ in events if t not in MEDIA_EVENTS] == [
            "run_created",
            "session_connected",
            "session_closed",
        ]
        assert events[-1][1] == {"reason": "deleted"}
    else:
        assert [e for e in events[1:] if e[0] not in MEDIA_EVENTS] == [
            ("session_closed", {"reason": "peer_gone"})
        ]
    assert len(manager.table) == 0
    assert manager.budget.figures().bytes_reserved == 0


async def test_each_peer_connection_keeps_its_own_certificate() -> None:
    """The wide-cipher certificate is the pair aiortc generated for that peer connection
    (no second generation per POST), so every session keeps its own DTLS identity."""
    from whip.rtc.peer import new_peer_connection

    pcs: list[RTCPeerConnection] = [new_peer_connection() for _ in range(2)]
    try:
        own = [pc._RTCPeerConnection__certificates for pc in pcs]  # type: ignore[attr-defined]
        for pc in pcs:
            use_wide_certificate(pc)
        wide = [pc._RTCPeerConnection__certificates for pc in pcs]  # type: ignore[attr-defined]
        assert [len(c) for c in wide] == [1, 1]
        assert all(type(c[0]) is WideCipherCertificate for c in wide)
        assert [(c[0]._key, c[0]._cert) for c in wide] == [(c[0]._key, c[0]._cert) for c in own]
        assert wide[0][0].getFingerprints() != wide[1][0].getFingerprints()
    finally:
        await asyncio.gather(*(pc.close() for pc in pcs))
