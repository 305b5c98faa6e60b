"""Transceivers hold exactly the answered codecs (:mod:`whip.rtc.transceiver_codecs`).

Pinned here, as the module docstring states them, on real aiortc peers (127.0.0.1):

- stock aiortc keeps every codec both sides support: offered Opus, PCMU and G722, its
  audio transceiver holds all three and its answer lists all three;
- after :func:`restrict_codecs` the transceiver holds only the plan's codecs (and the RTX
  of those, in aiortc's order), so the answer lists only those payload types and, once
  connected, a payload type outside the plan routes to no receiver, even on an SSRC the
  router has never seen;
- a section with no receivable codec returns False and the transceiver is left as it
  was (the caller makes it inactive).

Checked to fail (then restored): with the ``transceiver._codecs = codecs`` assignment
dropped, the answer and routing tests fail; with ``keep`` built from the payload types
only (no RTX), the RTX test fails; with the rejected-section check answering True, the
False test fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtp import RtpPacket

from tests.support.loopback import ConnectionStates, LoopbackPeers, loopback_peers
from whip.rtc.peer import dtls_transports
from whip.rtc.transceiver_codecs import restrict_codecs
from whip.sdp import OfferSummary, check_offer

OPUS_PCMU_G722 = ("audio/opus", "audio/PCMU", "audio/G722")
PCMU, G722 = 0, 9
"""Their static payload types (RFC 3551)."""


@pytest.fixture
async def peers() -> AsyncIterator[LoopbackPeers]:
    async with loopback_peers() as pool:
        yield pool


async def remote(peers: LoopbackPeers, offer: str) -> RTCPeerConnection:
    """An answerer with ``offer`` applied (its transceivers exist, nothing answered)."""
    pc = peers.new()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    for transceiver in pc.getTransceivers():
        transceiver.direction = "recvonly"
    return pc


def payload_types(transceiver: object) -> list[int]:
    return [c.payloadType for c in transceiver._codecs]  # type: ignore[attr-defined]


def answered_formats(sdp: str, kind: str) -> list[int]:
    """The payload types of the answer's ``m=kind`` line."""
    line = next(line for line in sdp.splitlines() if line.startswith(f"m={kind} "))
    return [int(pt) for pt in line.split()[3:]]


def rtpmaps(sdp: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in sdp.splitlines() if line.startswith("a=rtpmap:")]


async def answer_of(pc: RTCPeerConnection) -> str:
    await pc.setLocalDescription(await pc.createAnswer())
    return str(pc.localDescription.sdp)


def opus_plan(summary: OfferSummary) -> int:
    plan = summary.audio
    assert plan is not None and len(plan.payload_types) == 1
    assert plan.codecs[0].encoding == "opus"
    return plan.payload_types[0]


async def test_stock_aiortc_keeps_every_common_audio_codec(peers: LoopbackPeers) -> None:
    offer = await peers.publisher_offer(peers.new(), video=False, audio_codecs=OPUS_PCMU_G722)
    opus = opus_plan(check_offer(offer.encode()))
    stock = await remote(peers, offer)
    [transceiver] = stock.getTransceivers()
    assert payload_types(transceiver) == [opus, PCMU, G722]
    assert answered_formats(await answer_of(stock), "audio") == [opus, PCMU, G722]


async def test_an_opus_only_plan_leaves_only_opus_in_the_transceiver_and_the_answer(
    peers: LoopbackPeers,
) -> None:
    offer = await peers.publisher_offer(peers.new(), video=False, audio_codecs=OPUS_PCMU_G722)
    summary = check_offer(offer.encode())
    opus = opus_plan(summary)
    answerer = await remote(peers, offer)
    [transceiver] = answerer.getTransceivers()
    assert restrict_codecs(transceiver, summary) is True
    assert payload_types(transceiver) == [opus]
    answer = await answer_of(answerer)  # aiortc's own answer, before finalize_answer
    assert answered_formats(answer, "audio") == [opus]
    assert rtpmaps(answer) == ["opus/48000/2"]


@pytest.mark.parametrize("restricted", [True, False], ids=["restricted", "stock"])
async def test_once_connected_a_payload_type_outside_the_plan_routes_nowhere(
    peers: LoopbackPeers, restricted: bool
) -> None:
    publisher = peers.new()
    offer = await peers.publisher_offer(publisher, video=False, audio_codecs=OPUS_PCMU_G722)
    summary = check_offer(offer.encode())
    opus = opus_plan(summary)
    answerer = await remote(peers, offer)
    [transceiver] = answerer.getTransceivers()
    if restricted:
        assert restrict_codecs(transceiver, summary)
    states = ConnectionStates(answerer)
    answer = await answer_of(answerer)
    await publisher.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    await states.reached("connected")
    receiver = transceiver.receiver
    started = receiver._RTCRtpReceiver__started  # type: ignore[attr-defined]
    assert started, "aiortc passed its receive parameters"
    router = dtls_transports(answerer)[0]._rtp_router

    def routed(payload_type: int, ssrc: int) -> object:
        return router.route_rtp(RtpPacket(payload_type=payload_type, ssrc=ssrc))

    assert routed(opus, ssrc=1111) is receiver
    for index, pt in enumerate((PCMU, G722)):
        # New SSRCs: the router has nothing but the payload type to go by.
        assert routed(pt, ssrc=2222 + index) is (None if restricted else receiver)


async def test_codecs_take_the_plans_order_each_rtx_after_its_codec(peers: LoopbackPeers) -> None:
    offer = await peers.publisher_offer(peers.new(), audio=False)
    summary = check_offer(offer.encode())
    plan = summary.video
    assert plan is not None and plan.rtx_payload_types, "aiortc offers RTX for its video"
    answerer = await remote(peers, offer)
    [transceiver] = answerer.getTransceivers()
    before = payload_types(transceiver)
    assert restrict_codecs(transceiver, summary) is True
    apt = {c.payloadType: c.parameters.get("apt") for c in transceiver._codecs}
    expected: list[int] = []
    for pt in plan.payload_types:
        expected += [pt, *(r for r in plan.rtx_payload_types if str(apt.get(r)) == str(pt))]
    assert payload_types(transceiver) == [pt for pt in expected if pt in before]
    assert set(plan.rtx_payload_types) <= set(payload_types(transceiver))


async def test_a_section_with_no_receivable_codec_returns_false_and_is_left_alone(
    peers: LoopbackPeers,
) -> None:
    offer = await peers.publisher_offer(peers.new(), audio_codecs=("audio/PCMU", "audio/G722"))
    summary = check_offer(offer.encode())
    assert summary.audio is None, "the offer policy rejects the audio section"
    answerer = await remote(peers, offer)
    video, audio = answerer.getTransceivers()
    before = payload_types(audio)
    assert before == [PCMU, G722]
    assert restrict_codecs(audio, summary) is False
    assert payload_types(audio) == before
    assert restrict_codecs(video, summary) is True
