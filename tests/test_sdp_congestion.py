"""What an offer says about transport-cc, and the ceiling in the answer
(:mod:`whip.sdp.congestion`)."""

from __future__ import annotations

from pathlib import Path

from whip.sdp.congestion import (
    TransportCcOffer,
    announce_ceiling,
    announce_start_bitrate,
    offered_transport_cc,
    offers_transport_cc_video,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sdp"
TWCC = "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01"

OFFER = "\r\n".join(
    [
        "v=0",
        "o=- 1 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        "c=IN IP4 0.0.0.0",
        f"a=extmap:3 {TWCC}",
        "a=rtpmap:111 opus/48000/2",
        "a=rtcp-fb:111 transport-cc",
        "m=video 9 UDP/TLS/RTP/SAVPF 96 97 98",
        "c=IN IP4 0.0.0.0",
        f"a=extmap:3/sendonly {TWCC}",
        "a=rtpmap:96 VP8/90000",
        "a=rtcp-fb:96 goog-remb",
        "a=rtcp-fb:96 transport-cc",
        "a=rtpmap:97 rtx/90000",
        "a=rtpmap:98 H264/90000",
        "m=video 9 UDP/TLS/RTP/SAVPF 100 101",
        "a=rtcp-fb:* transport-cc",
        "m=video 9 UDP/TLS/RTP/SAVPF 102",
        f"a=extmap:4 {TWCC}",
        "a=rtcp-fb:102 nack",
        "",
    ]
)


def test_the_extension_id_and_the_payload_types_with_transport_cc_feedback() -> None:
    assert offered_transport_cc(OFFER) == [
        TransportCcOffer(3, frozenset({111})),
        TransportCcOffer(3, frozenset({96})),
        TransportCcOffer(None, frozenset({100, 101})),  # wildcard, but no extension
        TransportCcOffer(4, frozenset()),  # extension, but no feedback
    ]


def test_a_section_takes_transport_cc_only_with_both_for_a_kept_codec() -> None:
    audio, video, wildcard, no_feedback = offered_transport_cc(OFFER)
    assert video.usable_for({96, 97}) and audio.usable_for({111})
    assert not video.usable_for({98})  # H.264 kept alone: it offered no transport-cc
    assert not wildcard.usable_for({100}) and not no_feedback.usable_for({102})


def test_a_libwebrtc_offer_is_one_with_transport_cc_on_a_video_section() -> None:
    assert offers_transport_cc_video(OFFER)  # the first video section has both
    audio_only = OFFER[: OFFER.index("m=video")]
    assert not offers_transport_cc_video(audio_only)  # audio with transport-cc is not enough
    halves = OFFER[OFFER.index("m=video 9 UDP/TLS/RTP/SAVPF 100") :]
    assert not offers_transport_cc_video(halves)  # extension or feedback, never both
    for name, libwebrtc in [
        ("chrome_multi_codec", True),
        ("obs_h264_opus", False),
        ("ffmpeg_whip_h264_opus", False),
    ]:
        offer = (FIXTURES / f"{name}.sdp").read_text()
        assert offers_transport_cc_video(offer) is libwebrtc, name


ANSWER = "\r\n".join(
    [
        "v=0",
        "o=- 1 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        "c=IN IP4 0.0.0.0",
        "a=mid:0",
        "m=video 9 UDP/TLS/RTP/SAVPF 96",
        "c=IN IP4 0.0.0.0",
        "b=AS:100",
        "a=mid:1",
        "m=video 0 UDP/TLS/RTP/SAVPF 98",
        "c=IN IP4 0.0.0.0",
        "a=mid:2",
        "",
    ]
)


def test_the_ceiling_goes_into_accepted_video_sections_after_c() -> None:
    lines = announce_ceiling(ANSWER, 2_500_000).split("\r\n")
    video = lines.index("m=video 9 UDP/TLS/RTP/SAVPF 96")
    assert lines[video : video + 5] == [
        "m=video 9 UDP/TLS/RTP/SAVPF 96",
        "c=IN IP4 0.0.0.0",
        "b=AS:2500",
        "b=TIAS:2500000",
        "a=mid:1",
    ]
    assert "b=AS:100" not in lines  # replaced, not doubled
    assert lines.count("b=AS:2500") == 1  # not on audio, not on the rejected section


def test_no_ceiling_leaves_the_answer_alone() -> None:
    assert announce_ceiling(ANSWER, 0) is ANSWER


def test_the_start_bitrate_goes_on_every_video_codec_but_rtx() -> None:
    answer = "\r\n".join(
        [
            "v=0",
            "s=-",
            "m=audio 9 UDP/TLS/RTP/SAVPF 111",
            "a=rtpmap:111 opus/48000/2",
            "a=fmtp:111 minptime=10",
            "m=video 9 UDP/TLS/RTP/SAVPF 96 97 98",
            "a=rtpmap:96 VP8/90000",
            "a=rtcp-fb:96 nack",
            "a=rtpmap:97 rtx/90000",
            "a=fmtp:97 apt=96",
            "a=rtpmap:98 H264/90000",
            "a=fmtp:98 packetization-mode=1",
            "m=video 0 UDP/TLS/RTP/SAVPF 100",
            "a=rtpmap:100 VP9/90000",
            "",
        ]
    )
    lines = announce_start_bitrate(answer, 1_500_000).split("\r\n")
    assert lines[5:12] == [
        "m=video 9 UDP/TLS/RTP/SAVPF 96 97 98",
        "a=rtpmap:96 VP8/90000",
        "a=fmtp:96 x-google-start-bitrate=1500",  # added after its rtpmap
        "a=rtcp-fb:96 nack",
        "a=rtpmap:97 rtx/90000",
        "a=fmtp:97 apt=96",  # RTX untouched
        "a=rtpmap:98 H264/90000",
    ]
    assert "a=fmtp:98 packetization-mode=1;x-google-start-bitrate=1500" in lines
    assert "a=fmtp:111 minptime=10" in lines  # audio untouched
    assert lines[-3:] == ["m=video 0 UDP/TLS/RTP/SAVPF 100", "a=rtpmap:100 VP9/90000", ""]
    assert announce_start_bitrate(answer, 0) is answer
