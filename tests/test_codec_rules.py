"""whip.sdp.codec_rules: which video formats and fmtp are receivable, the fmtp the answer
gives each; and that the real answer (aiortc through the Negotiator) carries it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.loopback import LoopbackPeers, loopback_peers
from tests.support.servers import make_config
from whip.negotiation import Negotiator
from whip.rtc.codec_table import install_video_codecs
from whip.sdp import Codec, check_offer
from whip.sdp.codec_rules import video_answer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sdp"


def codec(name: str, fmtp: str = "", clock: int = 90000) -> Codec:
    pairs = tuple(tuple(p.split("=", 1)) for p in fmtp.split(";") if p)
    return Codec(96, name, clock, None, pairs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("offered", "answered"),
    [
        # H.265 (RFC 7798): profile, tier, level and the compatibility fields as offered;
        # sprop-* (the sender's) not answered.
        (codec("H265"), ""),
        (
            codec(
                "H265", "profile-id=2;tier-flag=1;level-id=156;sprop-max-don-diff=2;sprop-vps=QA"
            ),
            "profile-id=2;tier-flag=1;level-id=156",
        ),
        (codec("HEVC", "profile-space=0;profile-id=3"), "profile-space=0;profile-id=3"),
        (codec("H265", "interop-constraints=B00000000000"), "interop-constraints=B00000000000"),
        (codec("H265", "tx-mode=SRST;level-id=93"), "level-id=93"),
        (codec("H265", "profile-id=4"), None),  # RExt
        (codec("H265", "profile-space=1"), None),
        (codec("H265", "tier-flag=2"), None),
        (codec("H265", "tx-mode=MRST"), None),
        (codec("H265", "sprop-max-don-diff=40000"), None),
        (codec("H265", "level-id=x"), None),
        (codec("H265", clock=48000), None),
        # AV1: profile, level-idx and tier as offered.
        (codec("AV1", "level-idx=5;profile=0;tier=0"), "level-idx=5;profile=0;tier=0"),
        (codec("AV1", "profile=2"), "profile=2"),
        (codec("AV1", "profile=3"), None),
        (codec("AV1", "level-idx=32"), None),
        (codec("AV1", "tier=2"), None),
        # VP9 (RFC 9628): profile-id 0..3 as offered; max-fr/max-fs are not answered.
        (codec("VP9", "profile-id=2;max-fr=30"), "profile-id=2"),
        (codec("VP9", "profile-id=4"), None),
        # H.264: every profile FFmpeg decodes in full, the offer's parameters reflected.
        (
            codec("H264", "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=6e0028"),
            "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=6e0028",
        ),
        (
            codec("H264", "packetization-mode=1;profile-level-id=7a0028"),
            "packetization-mode=1;profile-level-id=7a0028",
        ),
        (codec("H264", "packetization-mode=1;profile-level-id=580028"), None),  # Extended
        (codec("H264", "packetization-mode=2"), None),
        (codec("VP8"), ""),
        (codec("H261"), None),
    ],
)
def test_video_answer(offered: Codec, answered: str | None) -> None:
    found = video_answer(offered)
    assert (None if found is None else ";".join(f"{k}={v}" for k, v in found)) == answered


def _obs_offer_with(rtpmap: str, fmtp: str) -> str:
    """OBS's H.264 offer (fixtures/sdp) with its video format replaced."""
    text = (FIXTURES / "obs_h264_opus.sdp").read_text()
    text = text.replace("a=rtpmap:96 H264/90000", f"a=rtpmap:96 {rtpmap}")
    old = "a=fmtp:96 profile-level-id=42e01f;packetization-mode=1;level-asymmetry-allowed=1"
    return text.replace(old, f"a=fmtp:96 {fmtp}" if fmtp else "")


@pytest.fixture
async def peers() -> AsyncIterator[LoopbackPeers]:
    install_video_codecs()  # what create_app does
    async with loopback_peers() as pool:
        yield pool


@pytest.mark.parametrize(
    ("rtpmap", "fmtp", "answered"),
    [
        (
            "H265/90000",
            "profile-id=2;tier-flag=1;level-id=156;sprop-max-don-diff=2",
            "profile-id=2;tier-flag=1;level-id=156",
        ),
        ("AV1/90000", "profile=1;level-idx=8;tier=1", "profile=1;level-idx=8;tier=1"),
        ("VP9/90000", "profile-id=2", "profile-id=2"),
        (
            "H264/90000",
            "profile-level-id=640c34;packetization-mode=1",
            "profile-level-id=640c34;packetization-mode=1",
        ),
        (
            "H264/90000",
            "profile-level-id=f40032;packetization-mode=1",
            "profile-level-id=f40032;packetization-mode=1",
        ),
    ],
    ids=["h265-main10", "av1-high", "vp9-profile2", "h264-high", "h264-444"],
)
async def test_the_answer_reflects_the_offered_fmtp(
    peers: LoopbackPeers, tmp_path: Path, rtpmap: str, fmtp: str, answered: str
) -> None:
    offer = _obs_offer_with(rtpmap, fmtp)
    summary = check_offer(offer.encode())
    negotiator = Negotiator(make_config(tmp_path), peer_factory=peers.new)
    negotiated = await negotiator.negotiate(offer, summary, "s_fmtp")
    try:
        lines = negotiated.answer_sdp.split("\r\n")
        assert f"a=rtpmap:96 {rtpmap}" in lines
        assert [line for line in lines if line.startswith("a=fmtp:96 ")] == [
            f"a=fmtp:96 {answered}"
        ]
    finally:
        await negotiated.pc.close()


def test_a_profile_the_pipeline_does_not_decode_leaves_the_video_section_out() -> None:
    summary = check_offer(_obs_offer_with("H265/90000", "profile-id=4").encode())
    assert summary.video is None and summary.audio is not None
    (video,) = [p for p in summary.sections if p.kind == "video"]
    assert video.reason is not None and "profile-id=4" in video.reason
