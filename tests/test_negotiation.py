"""Negotiation (:mod:`whip.negotiation`): one peer connection per offer, every patch in order.

Pinned here, as the module docstring states them:

- :meth:`Negotiator.negotiate` on a real aiortc offer (video + audio) returns the
  finalized answer, one intake per received kind, the liveness, and the peer it made
  through the injected ``peer_factory``; that peer has every patch: the certificate is a
  :class:`WideCipherCertificate` (in the DTLS transports too), every receiver is tapped
  and guarded, every transceiver holds only the answered codecs, the DTLS kick and the
  media liveness are installed; a publisher that applies the answer connects and its
  frames reach the intakes;
- the order: the certificate is replaced before any transceiver exists (before
  ``setRemoteDescription``), the codecs, directions and taps are in place before
  ``createAnswer``, the kick and the liveness before ``setLocalDescription`` (ICE);
- an audio track that is not analyzed, and a section the answer rejects, are tapped (into
  nothing) and guarded, with no intake;
- an offer aiortc refuses (no rtcp-mux) is :class:`UnprocessableOfferError` (422), and a
  failed or cancelled negotiation closes the peer it made;
- :class:`TapFaults` holds failures until routed, then forwards them in order, and every
  later one at once.

The factory is the test's: it makes real peer connections
(:func:`whip.rtc.peer.new_peer_connection`) and wraps three of each one's aiortc methods
to record, at each call, what the peer looked like (nothing of ours is replaced).

Checked to fail (then restored): with ``self.prepare_certificate(pc)`` moved after
``setRemoteDescription``, and with ``install_dtls_kick(pc)`` or
``install_media_liveness`` moved after ``setLocalDescription``, the order test fails;
with ``restrict_codecs`` ignored (every section receiving), the order and rejected-section
tests fail; with ``_tap`` not tapping an audio track nobody decodes, the not-analyzed
test fails; with the ``except BaseException`` close removed, the refusal and
cancellation tests fail; with ``TapFaults.report`` dropping what arrives before
``route_to``, the TapFaults test fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtcdtlstransport import RTCCertificate

from tests.support.loopback import ConnectionStates, LoopbackPeers, loopback_peers
from tests.support.servers import make_config
from whip.config import Config
from whip.negotiation import Negotiated, Negotiator, TapFaults
from whip.rtc.certificate import WideCipherCertificate
from whip.rtc.peer import dtls_transports
from whip.rtc.rtp_guard import guards_of
from whip.rtc.tap import TapNotInstalledError, install_tap
from whip.sdp import OfferSummary, UnprocessableOfferError, check_offer, finalize_answer
from whip.sdp.congestion import announce_ceiling

WAIT_S = 15.0
RECORDED = ("setRemoteDescription", "createAnswer", "setLocalDescription")


@pytest.fixture
async def peers() -> AsyncIterator[LoopbackPeers]:
    async with loopback_peers() as pool:
        yield pool


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path)


def looks(pc: RTCPeerConnection) -> dict[str, Any]:
    """What the patches have done to ``pc`` so far (aiortc's side of each)."""
    transceivers = []
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        ice = receiver.transport.transport
        transceivers.append(
            {
                "kind": transceiver.kind,
                "direction": transceiver.direction,
                "codecs": [c.payloadType for c in transceiver._codecs],
                "tapped": "receive" in vars(receiver),  # install_tap shadows receive()
                "guarded": bool(guards_of([receiver])),
                "kicked": ice._send != ice._connection.send,  # install_dtls_kick wraps it
                "liveness": "query_consent" in vars(ice._connection),
            }
        )
    return {
        "certificates": [
            type(c)
            for c in pc._RTCPeerConnection__certificates  # type: ignore[attr-defined]
        ],
        "transceivers": transceivers,
    }


@dataclass
class RecordingFactory:
    """A ``peer_factory`` that records each made peer's looks at three aiortc calls;
    ``hold`` (when set) blocks ``setLocalDescription`` until it is set."""

    peers: LoopbackPeers
    made: list[RTCPeerConnection] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    hold: asyncio.Event | None = None
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self) -> RTCPeerConnection:
        pc = self.peers.new()
        self.made.append(pc)
        for name in RECORDED:
            setattr(pc, name, self._recording(pc, name, getattr(pc, name)))
        return pc

    def _recording(
        self, pc: RTCPeerConnection, name: str, method: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def recorded(*args: Any) -> Any:
            self.calls.append((name, looks(pc)))
            if name == "setLocalDescription" and self.hold is not None:
                self.holding.set()
                await self.hold.wait()
            return await method(*args)

        return recorded


async def offer_and_summary(
    peers: LoopbackPeers, publisher: RTCPeerConnection, **kinds: Any
) -> tuple[str, OfferSummary]:
    offer = await peers.publisher_offer(publisher, **kinds)
    return offer, check_offer(offer.encode())


def answered(summary: OfferSummary, kind: str) -> list[int]:
    plan = next(p for p in summary.sections if p.kind == kind)
    keep = {*plan.payload_types, *plan.rtx_payload_types}
    return sorted(keep)


def assert_tapped(pc: RTCPeerConnection) -> None:
    for transceiver in pc.getTransceivers():
        with pytest.raises(TapNotInstalledError, match="already tapped"):
            install_tap(transceiver.receiver, lambda codec, frame: None)


async def test_negotiate_answers_a_real_offer_with_every_patch_in_order(
    peers: LoopbackPeers, config: Config
) -> None:
    publisher = peers.new()
    offer, summary = await offer_and_summary(peers, publisher, media=True)
    factory = RecordingFactory(peers)
    negotiated = await Negotiator(config, peer_factory=factory).negotiate(offer, summary, "s_n1")
    pc = negotiated.pc
    assert factory.made == [pc]

    # The order, as each aiortc call found the peer.
    assert [name for name, _ in factory.calls] == list(RECORDED)
    before_remote, before_answer, before_local = (seen for _, seen in factory.calls)
    assert before_remote == {"certificates": [WideCipherCertificate], "transceivers": []}
    patched = [
        {
            "kind": kind,
            "direction": "recvonly",
            "codecs": answered(summary, kind),
            "tapped": True,
            "guarded": True,
            "kicked": True,
            "liveness": True,
        }
        for kind in ("video", "audio")
    ]

    def by_codec(looks: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**t, "codecs": sorted(t["codecs"])} for t in looks["transceivers"]]

    assert by_codec(before_answer) == patched
    assert by_codec(before_local) == patched
    for dtls in dtls_transports(pc):
        assert type(dtls._RTCDtlsTransport__local_certificate) is WideCipherCertificate

    # What it returns.
    # aiortc offers no transport-cc, so no start bitrate; the default ceiling is announced.
    assert config.pipeline.max_bitrate_bps == 10_000_000
    assert negotiated.answer_sdp == announce_ceiling(
        finalize_answer(pc.localDescription.sdp, summary, config.server.public_hosts),
        config.pipeline.max_bitrate_bps,
    )
    assert negotiated.answer_sdp.count("b=AS:10000\r\n") == 1  # the video section's
    assert negotiated.answer_sdp.count("a=recvonly") == 2
    assert [(i.kind, i.label) for i in negotiated.intakes] == [
        ("video", "s_n1 video"),
        ("audio", "s_n1 audio"),
    ]
    assert negotiated.liveness.timeout_s == config.limits.reclaim_after_s
    assert_tapped(pc)

    # The answer works: the publisher connects and its frames reach the intakes.
    states = ConnectionStates(pc)
    await publisher.setRemoteDescription(
        RTCSessionDescription(sdp=negotiated.answer_sdp, type="answer")
    )
    await states.reached("connected")
    for intake in negotiated.intakes:
        frame = await asyncio.to_thread(intake.get, WAIT_S)
        assert frame is not None and frame.kind == intake.kind
    assert negotiated.liveness.media_packets > 0, "media reached the liveness first"


async def test_audio_nobody_analyzes_is_tapped_into_nothing(
    peers: LoopbackPeers, tmp_path: Path
) -> None:
    config = make_config(tmp_path, pipeline__analyze_audio=False)
    offer, summary = await offer_and_summary(peers, peers.new())
    negotiated = await Negotiator(config, peer_factory=peers.new).negotiate(offer, summary, "s")
    assert [i.kind for i in negotiated.intakes] == ["video"]
    assert_tapped(negotiated.pc)
    assert all(guards_of([t.receiver]) for t in negotiated.pc.getTransceivers())


async def test_a_rejected_section_is_inactive_tapped_and_guarded(
    peers: LoopbackPeers, config: Config
) -> None:
    offer, summary = await offer_and_summary(
        peers, peers.new(), audio_codecs=("audio/PCMU", "audio/G722")
    )
    assert summary.audio is None, "the offer policy rejects PCMU/G722-only audio"
    negotiated = await Negotiator(config, peer_factory=peers.new).negotiate(offer, summary, "s")
    video, audio = negotiated.pc.getTransceivers()
    assert (video.direction, audio.direction) == ("recvonly", "inactive")
    assert [i.kind for i in negotiated.intakes] == ["video"]
    assert_tapped(negotiated.pc)
    assert guards_of([audio.receiver]) == guards_of([video.receiver]), "one BUNDLE transport"
    assert "m=audio 0 " in negotiated.answer_sdp


async def test_an_offer_aiortc_refuses_is_422_and_its_peer_is_closed(
    peers: LoopbackPeers, config: Config
) -> None:
    offer, _ = await offer_and_summary(peers, peers.new())
    no_rtcp_mux = "".join(
        line + "\r\n" for line in offer.splitlines() if line and line != "a=rtcp-mux"
    )
    summary = check_offer(no_rtcp_mux.encode())  # our own checks accept it
    factory = RecordingFactory(peers)
    with pytest.raises(UnprocessableOfferError) as refused:
        await Negotiator(config, peer_factory=factory).negotiate(no_rtcp_mux, summary, "s")
    assert refused.value.http_status == 422
    assert "refused by the WebRTC stack" in str(refused.value)
    [pc] = factory.made
    assert (pc.connectionState, pc.signalingState) == ("closed", "closed")
    assert [name for name, _ in factory.calls] == ["setRemoteDescription"]


async def test_a_cancelled_negotiation_closes_its_peer(
    peers: LoopbackPeers, config: Config
) -> None:
    offer, summary = await offer_and_summary(peers, peers.new())
    factory = RecordingFactory(peers, hold=asyncio.Event())
    negotiating: asyncio.Task[Negotiated] = asyncio.create_task(
        Negotiator(config, peer_factory=factory).negotiate(offer, summary, "s")
    )
    async with asyncio.timeout(WAIT_S):
        await factory.holding.wait()
    negotiating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await negotiating
    [pc] = factory.made
    assert pc.connectionState == "closed"


async def test_the_certificate_step_is_a_seam(peers: LoopbackPeers, config: Config) -> None:
    class StockCertificate(Negotiator):
        def prepare_certificate(self, pc: RTCPeerConnection) -> None:
            return None

    offer, summary = await offer_and_summary(peers, peers.new())
    negotiated = await StockCertificate(config, peer_factory=peers.new).negotiate(
        offer, summary, "s"
    )
    own = negotiated.pc._RTCPeerConnection__certificates  # type: ignore[attr-defined]
    kinds = [type(c) for c in own]
    assert kinds == [RTCCertificate]


def test_tap_faults_are_held_until_routed_then_forwarded_in_order() -> None:
    faults = TapFaults()
    first, second, later = OSError("first"), ValueError("second"), RuntimeError("later")
    faults.report(first)
    faults.report(second)
    routed: list[BaseException] = []
    faults.route_to(routed.append)
    assert routed == [first, second]
    faults.report(later)
    assert routed == [first, second, later], "after routing, at once"
