"""whip.sdp.simulcast: what an offer sends as simulcast, and the answer that takes it all."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from whip.sdp import SdpError, check_offer
from whip.sdp.simulcast import (
    MAX_LAYERS,
    REPAIRED_RID_URI,
    RID_URI,
    answer_simulcast,
    decoded_layers,
    offered_simulcast,
    simulcast_mode,
)

FP = "sha-256 " + ":".join(["AB"] * 32)
HEAD = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    f"a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\na=fingerprint:{FP}\r\n"
    "a=setup:actpass\r\n"
)
AUDIO = (
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendonly\r\n"
    "a=rtcp-mux\r\na=rtpmap:111 opus/48000/2\r\n"
)


def video(*extra: str) -> str:
    """An OBS 32.1-shaped video section (no a=ssrc) with ``extra`` lines."""
    return (
        "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\na=sendonly\r\n"
        "a=rtcp-mux\r\na=rtpmap:96 H264/90000\r\n"
        "a=fmtp:96 profile-level-id=42e01f;packetization-mode=1\r\n"
        f"a=extmap:4 {RID_URI}\r\na=extmap:5 {REPAIRED_RID_URI}\r\n"
        + "".join(f"{line}\r\n" for line in extra)
    )


OBS = HEAD + AUDIO + video("a=rid:0 send", "a=rid:1 send", "a=rid:2 send", "a=simulcast:send 0;1;2")


def test_an_obs_offer_is_three_layers_with_their_extension_ids() -> None:
    (offer,) = offered_simulcast(OBS).values()
    assert offer.index == 1
    assert offer.rids == ("0", "1", "2")
    assert offer.paused == frozenset()
    assert offer.extension_id(RID_URI) == 4
    assert offer.extension_id(REPAIRED_RID_URI) == 5
    check_offer(OBS.encode())


def test_alternatives_and_paused_layers_are_answered_as_offered() -> None:
    sdp = (
        HEAD
        + AUDIO
        + video(
            "a=rid:h send max-width=1280", "a=rid:m send", "a=rid:l send", "a=simulcast:send h;~m,l"
        )
    )
    (offer,) = offered_simulcast(sdp).values()
    assert offer.paused == {"m"}
    answered = answer_simulcast(sdp.replace("a=sendonly", "a=recvonly"), {1: offer})
    video_lines = answered.split("m=video", 1)[1].splitlines()
    assert video_lines[2:7] == [
        "a=mid:1",
        "a=rid:h recv",
        "a=rid:m recv",
        "a=rid:l recv",
        "a=simulcast:recv h;~m,l",
    ]
    assert "a=rid:h send" not in answered


def test_a_rejected_section_gets_no_simulcast_lines() -> None:
    (offer,) = offered_simulcast(OBS).values()
    rejected = HEAD + AUDIO + "m=video 0 UDP/TLS/RTP/SAVPF 96\r\na=mid:1\r\n"
    assert "a=simulcast" not in answer_simulcast(rejected, {1: offer})


def test_rid_lines_without_simulcast_are_one_stream() -> None:
    assert offered_simulcast(HEAD + AUDIO + video("a=rid:0 send")) == {}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["a=rid:0 send", "a=simulcast:send 0;1"], "has no a=rid"),
        (["a=rid:0 send", "a=simulcast:send 0;0"], "listed twice"),
        (["a=rid:0 send", "a=rid:0 send", "a=simulcast:send 0"], "repeated"),
        (["a=rid:a.b send", "a=simulcast:send a.b"], "bad or repeated"),
        ([f"a=rid:{'x' * 17} send", f"a=simulcast:send {'x' * 17}"], "bad or repeated"),
        (["a=rid:0 send", "a=simulcast:recv 0"], "must offer 'send"),
        (["a=rid:0 send", "a=simulcast:send 0", "a=simulcast:send 0"], "appears twice"),
        (
            [*(f"a=rid:{i} send" for i in range(MAX_LAYERS + 1))],
            f"more than {MAX_LAYERS}",
        ),
    ],
)
def test_bad_simulcast_is_a_400_before_anything_is_taken(lines: list[str], message: str) -> None:
    with pytest.raises(SdpError, match=message) as caught:
        check_offer((HEAD + AUDIO + video(*lines)).encode())
    assert caught.value.http_status == 400


@given(
    st.lists(
        st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=16),
        min_size=1,
        max_size=MAX_LAYERS,
        unique=True,
    )
)
def test_every_offered_rid_is_answered_in_the_offers_order(rids: list[str]) -> None:
    sdp = (
        HEAD
        + AUDIO
        + video(*(f"a=rid:{r} send" for r in rids), "a=simulcast:send " + ";".join(rids))
    )
    offers = offered_simulcast(sdp)
    answered = answer_simulcast(sdp, offers)
    recv = [
        line[6:-5]
        for line in answered.splitlines()
        if line.startswith("a=rid:") and line.endswith(" recv")
    ]
    assert recv == rids
    assert f"a=simulcast:recv {';'.join(rids)}" in answered.splitlines()


@pytest.mark.parametrize(
    ("mode", "codec", "effective"),
    [
        ("all", "H264", "all"),
        ("all", "VP8", "all"),
        ("all", "H265", "highest"),
        ("all", "AV1", "highest"),
        ("all", "VP9", "highest"),
        ("lowest", "AV1", "lowest"),
        ("highest", None, "highest"),
    ],
)
def test_all_is_per_layer_only_for_stateless_depayloaders(
    mode: str, codec: str | None, effective: str
) -> None:
    assert simulcast_mode(mode, codec) == effective
    (offer,) = offered_simulcast(OBS).values()
    assert decoded_layers(offer, effective) == (3 if effective == "all" else 1)
