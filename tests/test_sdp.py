"""whip.sdp: offer parsing, offer policy, answer policy (fixtures under fixtures/sdp)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from whip.errors import HttpError
from whip.sdp import (
    DEFAULT_VIDEO_CODECS,
    AnswerMismatchError,
    Codec,
    Direction,
    NothingReceivableError,
    OfferSummary,
    SdpError,
    SdpTooLargeError,
    TooManyTracksError,
    UnsupportedMediaTypeError,
    add_host_candidates,
    check_content_type,
    check_offer,
    finalize_answer,
    parse_description,
    parse_offer,
    receivable,
)
from whip.sdp.codec_rules import video_format

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sdp"
GOOD = [
    "obs_h264_opus",
    "ffmpeg_whip_h264_opus",
    "chrome_multi_codec",
    "chrome_video_datachannel",
    "gstreamer_webrtcbin",
    "video_only_vp8",
    "audio_only_opus",
]
FP = "sha-256 " + ":".join(["AB"] * 32)


def offer(name: str) -> bytes:
    return (FIXTURES / f"{name}.sdp").read_bytes()


def answer(name: str) -> str:
    return (FIXTURES / "answers" / f"{name}.aiortc.sdp").read_bytes().decode()


def minimal(*media: str, session: str = "") -> bytes:
    """A small valid offer with session-level ICE/DTLS and the given media blocks."""
    head = (
        "v=0\no=- 1 1 IN IP4 127.0.0.1\ns=-\nt=0 0\n"
        f"a=ice-ufrag:abcd\na=ice-pwd:0123456789abcdefghijkl\na=fingerprint:{FP}\n{session}"
    )
    return (head + "".join(media)).encode()


def video(mid: str = "v", direction: str = "sendonly", port: int = 9, extra: str = "") -> str:
    return (
        f"m=video {port} UDP/TLS/RTP/SAVPF 96\nc=IN IP4 0.0.0.0\na=mid:{mid}\na={direction}\n"
        f"a=rtpmap:96 VP8/90000\n{extra}"
    )


def audio(mid: str = "a", direction: str = "sendonly", proto: str = "UDP/TLS/RTP/SAVPF") -> str:
    return f"m=audio 9 {proto} 111\na=mid:{mid}\na={direction}\na=rtpmap:111 opus/48000/2\n"


def plans(
    summary: OfferSummary,
) -> list[tuple[str, str | None, bool, tuple[int, ...], tuple[int, ...]]]:
    return [
        (p.kind, p.mid, p.accepted, p.payload_types, p.rtx_payload_types) for p in summary.sections
    ]


# --- real-world offers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("obs_h264_opus", [("audio", "0", True, (111,), ()), ("video", "1", True, (96,), ())]),
        (
            "ffmpeg_whip_h264_opus",
            [("audio", "0", True, (111,), ()), ("video", "1", True, (106,), ())],
        ),
        (
            "chrome_multi_codec",
            [
                ("audio", "0", True, (111,), ()),
                # the server's preference (H.264, AV1, VP9, VP8), then the offer's order
                (
                    "video",
                    "1",
                    True,
                    (103, 109, 39, 112, 45, 98, 100, 96),
                    (97, 104, 114, 40, 99, 101, 46, 113),
                ),
            ],
        ),
        (
            "chrome_video_datachannel",
            [("video", "0", True, (96,), (97,)), ("application", "1", False, (), ())],
        ),
        (
            "gstreamer_webrtcbin",
            [("video", "video0", True, (96,), (97,)), ("audio", "audio1", True, (98,), ())],
        ),
        ("video_only_vp8", [("video", "v", True, (102, 96), (97,))]),
        ("audio_only_opus", [("audio", "a0", True, (111,), ())]),
    ],
)
def test_real_world_offers_are_planned(name: str, expected: list[object]) -> None:
    assert plans(check_offer(offer(name))) == expected


def test_session_level_transport_attributes_are_inherited() -> None:
    parsed = parse_offer(offer("obs_h264_opus"))
    assert [(m.ice_ufrag, m.ice_pwd, m.setup) for m in parsed.media] == [
        ("PkLE", "Ub/sQ2b8vq7U6pYBuZQ+Lx", "actpass")
    ] * 2
    assert all(len(m.fingerprints) == 1 for m in parsed.media)
    assert parsed.bundle == ("0", "1")
    assert parsed.origin.startswith("rtc ")


def test_ffmpeg_passive_setup_and_media_level_attributes() -> None:
    parsed = parse_offer(offer("ffmpeg_whip_h264_opus"))
    assert [(m.setup, m.direction, m.ice_ufrag) for m in parsed.media] == [
        ("passive", Direction.SENDONLY, "1f3c9a2e")
    ] * 2
    assert parsed.name == "FFmpegPublishSession"


def test_codec_names_are_case_insensitive_and_sendrecv_is_a_publisher() -> None:
    summary = check_offer(offer("gstreamer_webrtcbin"))
    assert summary.audio is not None and summary.audio.chosen is not None
    assert summary.audio.chosen.name == "OPUS"
    assert summary.video is not None and summary.video.chosen is not None
    assert summary.video.chosen.param("PROFILE-LEVEL-ID") == "42c01f"


def test_chrome_codec_details() -> None:
    parsed = parse_offer(offer("chrome_multi_codec"))
    video_section = parsed.media[1]
    assert len(video_section.codecs) == len(video_section.formats) == 25
    h264 = [c for c in video_section.codecs if c.encoding == "h264"]
    assert [(c.payload_type, c.param("packetization-mode")) for c in h264] == [
        (103, "1"), (107, "0"), (109, "1"), (115, "0"), (39, "1"), (41, "0"), (112, "1"),
    ]  # fmt: skip
    red = next(c for c in parsed.media[0].codecs if c.payload_type == 63)
    assert (red.name, red.clock_rate, red.channels, red.params) == (
        "red",
        48000,
        2,
        (("111/111", ""),),
    )
    summary = check_offer(offer("chrome_multi_codec"))
    assert summary.video is not None and summary.video.chosen is not None
    assert summary.video.chosen.encoding == "h264"  # the server's first preference
    vp8_first = check_offer(offer("chrome_multi_codec"), video_codecs=("vp8", "h264"))
    assert vp8_first.video is not None and vp8_first.video.payload_types[:2] == (96, 103)


def test_lf_line_endings_and_candidates_in_offer() -> None:
    assert b"\r\n" not in offer("video_only_vp8")
    parsed = parse_offer(offer("video_only_vp8"))
    assert [c.payload_type for c in parsed.media[0].codecs] == [96, 97, 102]


@pytest.mark.parametrize(
    ("name", "status", "code", "fragment"),
    [
        ("bad_binary", 400, "bad_sdp", "not UTF-8"),
        ("bad_garbage_line", 400, "bad_sdp", "line 20: not an SDP line"),
        ("bad_missing_origin", 400, "bad_sdp", "missing 'o='"),
        ("bad_no_media", 400, "bad_sdp", "no media section"),
        ("bad_no_version", 400, "bad_sdp", "line 1: an SDP description starts with 'v=0'"),
        ("bad_rtpmap", 400, "bad_sdp", "line 31: malformed a=rtpmap"),
        ("bad_nothing_receivable", 422, "nothing_receivable", "packetization-mode=0"),
        ("bad_two_video", 422, "too_many_tracks", "line 10, line 16"),
    ],
)
def test_bad_offers(name: str, status: int, code: str, fragment: str) -> None:
    with pytest.raises(SdpError) as info:
        # bad_nothing_receivable also offers AV1, which a server taking H.264 only refuses
        check_offer(offer(name), video_codecs=("h264", "vp8"))
    assert (info.value.http_status, info.value.code) == (status, code)
    assert fragment in info.value.message


# --- body checks --------------------------------------------------------------------------


def test_size_cap_is_inclusive() -> None:
    body = offer("obs_h264_opus")
    check_offer(body, max_bytes=len(body))
    with pytest.raises(SdpTooLargeError) as info:
        check_offer(body, max_bytes=len(body) - 1)
    assert info.value.http_status == 413 and info.value.code == "sdp_too_large"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "empty"),
        (b" \r\n\r\n", "empty"),
        (b"v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=\x00\r\n", "line 3: control character"),
        (b"v=0\ns=-\x1b[31m\n", "line 2: control character"),
        (b"v=0\rs=-\n", "line 1: control character"),
        (b"\xef\xbb\xbfv=0\n", "line 1: not an SDP line"),
        (b"\x89PNG\r\n\x1a\n", "not UTF-8"),
    ],
)
def test_binary_and_empty_bodies(body: bytes, fragment: str) -> None:
    with pytest.raises(SdpError) as info:
        parse_offer(body)
    assert info.value.http_status == 400 and fragment in info.value.message


# --- syntax errors name their line --------------------------------------------------------

BASE = minimal(video(), audio()).decode()
R = "a=rtpmap:96 VP8/90000\n"


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("t=0 0\n", "t=0 0\nnonsense\n", "line 5: not an SDP line"),
        ("t=0 0\n", "t=0 0\nA=upper\n", "line 5: not an SDP line"),
        ("t=0 0\n", "t=0 0\nv=0\n", "line 5: unexpected 'v='"),
        ("s=-\n", "s=-\ns=again\n", "line 4: unexpected 's='"),
        ("o=- 1 1 IN IP4 127.0.0.1\n", "o=- 1 IN IP4 127.0.0.1\n", "line 2: o= needs six fields"),
        ("a=mid:v\n", "a=mid:v\no=- 1 1 IN IP4 1.2.3.4\n", "unexpected 'o='"),
        ("m=video 9 ", "m=video 70000 ", "line 8: bad port"),
        ("m=video 9 ", "m=video nine ", "line 8: bad port"),
        ("SAVPF 96\n", "SAVPF opus\n", "line 8: bad payload type"),
        ("SAVPF 96\n", "SAVPF 128\n", "line 8: bad payload type"),
        ("SAVPF 96\n", "SAVPF 96 96\n", "line 8: payload type listed twice"),
        ("m=video 9 UDP/TLS/RTP/SAVPF 96\n", "m=video 9 UDP/TLS/RTP/SAVPF\n", "line 8: m= needs"),
        (R, R + R, "line 13: second a=rtpmap"),
        (R, "a=rtpmap:96 VP8/0\n", "line 12: malformed a=rtpmap"),
        (R, "a=rtpmap:200 VP8/90000\n", "line 12: malformed a=rtpmap"),
        (R, R + "a=fmtp:x y\n", "line 13: malformed a=fmtp"),
        (R, R + "a=fmtp:96 a=1\na=fmtp:96 b=2\n", "line 14: second a=fmtp"),
        ("a=mid:a\n", "a=mid:v\n", "duplicate mid 'v'"),
        ("a=mid:v\n", "a=mid:v\na=mid:w\n", "line 11: bad or repeated a=mid"),
        ("a=mid:v\n", "a=mid:\n", "line 10: bad or repeated a=mid"),
        ("a=sendonly\n", "a=sendonly\na=recvonly\n", "line 12: more than one direction"),
        ("t=0 0\n", "t=0 0\na=setup:maybe\n", "line 5: bad or repeated a=setup"),
        ("a=fingerprint:sha-256 AB", "a=fingerprint:sha-256 ZZ", "line 7: malformed a=fingerprint"),
        ("a=ice-ufrag:abcd\n", "a=ice-ufrag:ab cd\n", "line 5: malformed a=ice-ufrag"),
        ("a=ice-pwd:0123456789abcdefghijkl\n", "", "line 7: media section 0 has no a=ice-pwd"),
        ("a=ice-ufrag:abcd\n", "", "has no a=ice-ufrag"),
        (f"a=fingerprint:{FP}\n", "", "has no a=fingerprint"),
        ("t=0 0\n", "t=0 0\na=group:BUNDLE v x\n", "line 5: BUNDLE names unknown mid 'x'"),
        ("t=0 0\n", "t=0 0\na=group:BUNDLE v\na=group:BUNDLE a\n", "line 6: more than one BUNDLE"),
        ("t=0 0\n", "t=0 0\na=:nothing\n", "line 5: malformed attribute"),
        ("a=mid:v\n", "a=mid:v\r\r\n", "line 10: control character"),
        ("v=0\n", "v=1\n", "line 1: an SDP description starts with 'v=0'"),
    ],
)  # fmt: skip
def test_syntax_errors_name_the_line(old: str, new: str, fragment: str) -> None:
    assert old in BASE
    with pytest.raises(SdpError) as info:
        check_offer(BASE.replace(old, new, 1).encode())
    assert (info.value.http_status, info.value.code) == (400, "bad_sdp")
    assert fragment in info.value.message


def test_base_offer_is_valid() -> None:
    assert [(p.kind, p.accepted) for p in check_offer(BASE.encode()).sections] == [
        ("video", True),
        ("audio", True),
    ]


def test_tolerated_oddities() -> None:
    body = BASE.replace("t=0 0\n", "t=0 0\n\nb=AS:3000\nk=prompt\na=x-custom:whatever\n\n")
    body = body.replace(
        "a=rtpmap:96 VP8/90000\n", "a=rtpmap:96 VP8/90000  \na=rtpmap:99 H264/90000\n"
    )
    body = body.replace("SAVPF 96\n", "SAVPF 96 100 0\n")  # 100: no rtpmap; 0: static PCMU
    parsed = parse_offer(body.encode())
    assert [c.payload_type for c in parsed.media[0].codecs] == [96]  # 99 not offered
    assert parsed.media[0].formats == ("96", "100", "0")


def test_non_rtp_sections_may_have_non_numeric_formats() -> None:
    body = minimal(video(), "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\na=mid:d\n")
    summary = check_offer(body)
    assert [(p.kind, p.accepted, p.reason) for p in summary.sections] == [
        ("video", True, None),
        ("application", False, "application sections are not ingested"),
    ]


# --- offer policy ---------------------------------------------------------------------------


def h264(params: str, pt: int = 102, clock: int = 90000) -> Codec:
    pairs = tuple((key, value) for key, _, value in (p.partition("=") for p in params.split(";")))
    return Codec(pt, "H264", clock, None, tuple(pair for pair in pairs if pair[0]))


@pytest.mark.parametrize(
    ("kind", "codec", "expected"),
    [
        ("video", h264("packetization-mode=1;profile-level-id=42e01f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=42C01F"), True),
        ("video", h264("packetization-mode=1;profile-level-id=42001f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=4d0032"), True),
        ("video", h264("packetization-mode=1;profile-level-id=640c1f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=64001f"), True),
        ("video", h264("packetization-mode=1"), True),
        ("video", h264("packetization-mode=1;profile-level-id=6e001f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=7a001f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=f4001f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=2c001f"), True),
        ("video", h264("packetization-mode=1;profile-level-id=58001f"), False),
        ("video", h264("packetization-mode=1;profile-level-id=80001f"), False),
        ("video", h264("packetization-mode=1;profile-level-id=42e0"), False),
        ("video", h264("packetization-mode=1;profile-level-id=zze01f"), False),
        ("video", h264("packetization-mode=0;profile-level-id=42e01f"), False),
        ("video", h264("profile-level-id=42e01f"), False),
        ("video", h264("packetization-mode=1", clock=8000), False),
        ("audio", h264("packetization-mode=1"), False),
        ("video", Codec(96, "VP8", 90000), True),
        ("video", Codec(96, "vp8", 48000), False),
        ("audio", Codec(96, "VP8", 90000), False),
        ("video", Codec(98, "VP9", 90000), True),
        ("video", Codec(45, "AV1", 90000), True),
        ("video", Codec(49, "H265", 90000), True),
        ("video", Codec(49, "H265", 48000), False),
        ("audio", Codec(111, "opus", 48000, 2), True),
        ("audio", Codec(111, "Opus", 48000, 2), True),
        ("audio", Codec(111, "opus", 48000), False),
        ("audio", Codec(111, "opus", 48000, 1), False),
        ("audio", Codec(111, "opus", 16000, 2), False),
        ("video", Codec(111, "opus", 48000, 2), False),
        ("audio", Codec(0, "PCMU", 8000), False),
    ],
)
def test_receivable_codecs(kind: str, codec: Codec, expected: bool) -> None:
    assert receivable(kind, codec) is expected


def test_rtx_is_kept_only_for_kept_codecs() -> None:
    section = (
        "m=video 9 UDP/TLS/RTP/SAVPF 98 99 96 97 100\na=mid:v\na=sendonly\n"
        "a=rtpmap:98 VP9/90000\na=rtpmap:99 rtx/90000\na=fmtp:99 apt=98\n"
        "a=rtpmap:96 VP8/90000\na=rtpmap:97 rtx/90000\na=fmtp:97 apt=96\n"
        "a=rtpmap:100 rtx/90000\na=fmtp:100 apt=x\n"
    )
    summary = check_offer(minimal(section))
    assert plans(summary) == [("video", "v", True, (98, 96), (99, 97))]
    vp8_only = check_offer(minimal(section), video_codecs=("vp8",))
    assert plans(vp8_only) == [("video", "v", True, (96,), (97,))]


@pytest.mark.parametrize(
    ("media", "reason"),
    [
        (video(direction="recvonly"), "direction recvonly: a WHIP publisher must send"),
        (video(direction="inactive"), "direction inactive"),
        (video(port=0), "disabled by the offer (port 0)"),
        (audio(proto="RTP/AVP"), "transport RTP/AVP is not supported"),
    ],
)
def test_rejected_sections(media: str, reason: str) -> None:
    summary = check_offer(minimal(media, audio(mid="ok")))
    assert summary.sections[0].accepted is False
    assert summary.sections[0].reason is not None and reason in summary.sections[0].reason
    assert summary.sections[1].accepted is True
    with pytest.raises(NothingReceivableError) as info:
        check_offer(minimal(media))
    assert info.value.http_status == 422 and reason in info.value.message


def test_bundle_only_section_with_port_zero_is_active() -> None:
    body = minimal(audio(), video(port=0, extra="a=bundle-only\n"), session="a=group:BUNDLE a v\n")
    assert [p.accepted for p in check_offer(body).sections] == [True, True]


def test_session_level_direction_is_the_default() -> None:
    body = minimal(
        "m=video 9 UDP/TLS/RTP/SAVPF 96\na=mid:v\na=rtpmap:96 VP8/90000\n", session="a=recvonly\n"
    )
    assert parse_offer(body).media[0].direction is Direction.RECVONLY
    with pytest.raises(NothingReceivableError):
        check_offer(body)
    body = minimal("m=video 9 UDP/TLS/RTP/SAVPF 96\na=mid:v\na=rtpmap:96 VP8/90000\n")
    assert parse_offer(body).media[0].direction is Direction.SENDRECV


def test_one_sending_track_per_kind() -> None:
    with pytest.raises(TooManyTracksError) as info:
        check_offer(minimal(audio("a1"), audio("a2")))
    assert info.value.http_status == 422 and "2 sending audio sections" in info.value.message
    # a second, receive-only video section is merely rejected
    summary = check_offer(minimal(video("v1"), video("v2", direction="recvonly")))
    assert [p.accepted for p in summary.sections] == [True, False]


def test_summary_accessors() -> None:
    summary = check_offer(offer("chrome_video_datachannel"))
    assert summary.audio is None
    assert summary.video is summary.sections[0]
    assert summary.accepted == (summary.sections[0],)
    assert summary.sections[1].chosen is None


def test_content_type() -> None:
    check_content_type("application/sdp")
    check_content_type("Application/SDP; charset=utf-8")
    for bad in (None, "", "text/plain", "application/sdpx", "application/trickle-ice-sdpfrag"):
        with pytest.raises(UnsupportedMediaTypeError) as info:
            check_content_type(bad)
        assert info.value.http_status == 415


def test_error_tree() -> None:
    assert all(issubclass(e, HttpError) for e in (SdpError, AnswerMismatchError))
    assert [e.http_status for e in (SdpError, SdpTooLargeError, UnsupportedMediaTypeError)] == [
        400,
        413,
        415,
    ]
    assert (NothingReceivableError.http_status, TooManyTracksError.http_status) == (422, 422)
    assert AnswerMismatchError.http_status == 500


# --- answer policy ------------------------------------------------------------------------


def lines_of(sdp: str) -> list[str]:
    assert sdp.endswith("\r\n") and "\n" not in sdp.replace("\r\n", "")
    return sdp.split("\r\n")[:-1]


def section_lines(sdp: str, index: int) -> list[str]:
    blocks: list[list[str]] = []
    for line in lines_of(sdp):
        if line.startswith("m="):
            blocks.append([])
        if blocks:
            blocks[-1].append(line)
    return blocks[index]


def test_finalize_chrome_answer() -> None:
    summary = check_offer(offer("chrome_multi_codec"))
    raw = answer("chrome_multi_codec")
    assert "a=rtpmap:0 PCMU/8000" in raw
    final = finalize_answer(raw, summary)
    parsed = parse_description(final)
    assert [m.formats for m in parsed.media] == [("111",), ("96", "97", "103", "104", "109", "114")]
    assert [m.direction for m in parsed.media] == [Direction.RECVONLY] * 2
    assert parsed.bundle == ("0", "1")
    audio_lines = section_lines(final, 0)
    assert [line for line in audio_lines if line.startswith("a=rtpmap")] == [
        "a=rtpmap:111 opus/48000/2"
    ]
    for index in (0, 1):
        block = section_lines(final, index)
        assert block.count("a=recvonly") == 1 and block.count("a=end-of-candidates") == 1
    untouched = [
        line
        for line in lines_of(raw)
        if not line.startswith(("a=rtpmap:9 ", "a=rtpmap:0 ", "a=rtpmap:8 ", "m=audio"))
    ]
    assert untouched == [line for line in lines_of(final) if not line.startswith("m=audio")]


def test_finalize_rejects_datachannel_section() -> None:
    summary = check_offer(offer("chrome_video_datachannel"))
    final = finalize_answer(answer("chrome_video_datachannel"), summary, ["198.51.100.4"])
    assert section_lines(final, 1) == [
        "m=application 0 UDP/DTLS/SCTP webrtc-datachannel",
        "c=IN IP4 192.0.2.2",
        "a=mid:1",
    ]
    assert "a=group:BUNDLE 0" in lines_of(final)
    parsed = parse_description(final)
    assert [(m.kind, m.port == 0) for m in parsed.media] == [
        ("video", False),
        ("application", True),
    ]
    assert any(" 198.51.100.4 " in line for line in section_lines(final, 0))


def test_finalize_filters_to_plan_and_forces_recvonly() -> None:
    rtx = "a=rtpmap:97 rtx/90000\na=fmtp:97 apt=96\n"
    summary = check_offer(minimal(video(mid="v", extra=rtx).replace(" 96\n", " 96 97\n", 1)))
    raw = (
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=sendrecv\r\na=group:BUNDLE v\r\n"
        "m=video 5000 UDP/TLS/RTP/SAVPF 96 97 98\r\nc=IN IP4 10.0.0.1\r\na=sendrecv\r\na=mid:v\r\n"
        "a=rtpmap:96 VP8/90000\r\na=rtcp-fb:96 nack\r\na=rtcp-fb:* ccm fir\r\n"
        "a=rtpmap:97 rtx/90000\r\na=fmtp:97 apt=96\r\n"
        "a=rtpmap:98 VP9/90000\r\na=rtcp-fb:98 nack\r\n"
        "a=fmtp:98 profile-id=0\r\na=candidate:1 1 udp 2130706431 10.0.0.1 5000 typ host\r\n"
    )
    final = finalize_answer(raw, summary)
    assert lines_of(final) == [
        "v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE v",
        "m=video 5000 UDP/TLS/RTP/SAVPF 96 97", "c=IN IP4 10.0.0.1", "a=recvonly", "a=mid:v",
        "a=rtpmap:96 VP8/90000", "a=rtcp-fb:96 nack", "a=rtcp-fb:* ccm fir",
        "a=rtpmap:97 rtx/90000", "a=fmtp:97 apt=96",
        "a=candidate:1 1 udp 2130706431 10.0.0.1 5000 typ host", "a=end-of-candidates",
    ]  # fmt: skip
    # idempotent
    assert finalize_answer(final, summary) == final
    # no direction at all: recvonly goes after the mid
    bare = finalize_answer(raw.replace("a=sendrecv\r\n", ""), summary)
    assert lines_of(bare)[6:9] == ["c=IN IP4 10.0.0.1", "a=mid:v", "a=recvonly"]


def test_finalize_when_the_stack_kept_no_planned_codec() -> None:
    summary = check_offer(offer("chrome_video_datachannel"))
    raw = answer("chrome_video_datachannel").replace(" 96 97\r\n", " 98\r\n", 1)
    with pytest.raises(NothingReceivableError):
        finalize_answer(raw, summary)
    two = check_offer(offer("obs_h264_opus"))
    raw = (
        answer("obs_h264_opus")
        .replace("m=video 0", "m=video 0")
        .replace("UDP/TLS/RTP/SAVPF 96\r\n", "UDP/TLS/RTP/SAVPF 100\r\n")
    )
    final = finalize_answer(raw, two)
    assert parse_description(final).bundle == ("0",)
    assert section_lines(final, 1)[0] == "m=video 0 UDP/TLS/RTP/SAVPF 100"


def test_finalize_detects_mismatched_answers() -> None:
    summary = check_offer(offer("obs_h264_opus"))
    raw = answer("obs_h264_opus")
    with pytest.raises(AnswerMismatchError) as info:
        finalize_answer(raw.split("m=video")[0], summary)
    assert info.value.http_status == 500
    with pytest.raises(AnswerMismatchError):
        finalize_answer(raw.replace("a=mid:1", "a=mid:9"), summary)


def test_end_of_candidates_added_once() -> None:
    summary = check_offer(offer("gstreamer_webrtcbin"))
    raw = answer("gstreamer_webrtcbin").replace("a=end-of-candidates\r\n", "")
    final = finalize_answer(raw, summary)
    for index in (0, 1):
        block = section_lines(final, index)
        assert block.count("a=end-of-candidates") == 1
        last_candidate = max(i for i, line in enumerate(block) if line.startswith("a=candidate:"))
        assert block[last_candidate + 1] == "a=end-of-candidates"


ANSWER_WITH_CANDIDATES = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
    f"a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\na=fingerprint:{FP}\r\n"
    "m=audio 4000 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"
    "a=candidate:a 1 udp 2130706431 10.0.0.5 4000 typ host\r\n"
    "a=candidate:b 1 udp 2130706431 fd00::5 4006 typ host\r\n"
    "a=candidate:c 2 udp 2130706430 10.0.0.5 4001 typ host\r\n"
    "a=candidate:d 1 udp 1694498815 203.0.113.9 61000 typ srflx raddr 10.0.0.5 rport 4000\r\n"
    "a=end-of-candidates\r\n"
    "m=video 0 UDP/TLS/RTP/SAVPF 96\r\na=mid:1\r\n"
)


def test_add_host_candidates() -> None:
    result = add_host_candidates(ANSWER_WITH_CANDIDATES, ["127.0.0.1", "2001:db8::7", "10.0.0.5"])
    block = section_lines(result, 0)
    added = block[
        block.index(
            "a=candidate:d 1 udp 1694498815 203.0.113.9 61000 typ srflx raddr 10.0.0.5 rport 4000"
        )
        + 1 : -1
    ]
    parts = [line.split() for line in added]
    assert [(p[1], p[2], p[4], p[5], p[6:]) for p in parts] == [
        ("1", "udp", "127.0.0.1", "4000", ["typ", "host"]),
        ("2", "udp", "127.0.0.1", "4001", ["typ", "host"]),
        ("1", "udp", "2001:db8::7", "4006", ["typ", "host"]),
        ("2", "udp", "2001:db8::7", "4001", ["typ", "host"]),  # no IPv6 for component 2
    ]  # 10.0.0.5 is already there
    assert block[-1] == "a=end-of-candidates"
    priorities = [int(p[3]) for p in parts]
    assert all(p < 2130706431 for p in priorities)
    assert priorities[0] > priorities[2]  # configured order is preference order
    foundations = {p[0] for p in parts}
    assert len(foundations) == 2  # one per address
    assert section_lines(result, 1) == section_lines(ANSWER_WITH_CANDIDATES, 1)  # no candidates
    assert add_host_candidates(ANSWER_WITH_CANDIDATES, ["127.0.0.1"]) == add_host_candidates(
        ANSWER_WITH_CANDIDATES, ["127.0.0.1"]
    )
    assert add_host_candidates(ANSWER_WITH_CANDIDATES, []) == ANSWER_WITH_CANDIDATES
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        add_host_candidates(ANSWER_WITH_CANDIDATES, ["example.com"])
    reparsed = parse_description(result)
    assert len(reparsed.media) == 2


# --- properties ---------------------------------------------------------------------------

GOOD_BODIES = [offer(name) for name in GOOD]


def survives(body: bytes, max_bytes: int = 32 * 1024) -> OfferSummary | None:
    """check_offer either answers or raises one of the module's HTTP errors."""
    try:
        return check_offer(body, max_bytes=max_bytes)
    except SdpError as exc:
        assert isinstance(exc, HttpError) and exc.http_status in (400, 413, 422)
        assert exc.message
        return None


@given(st.binary(max_size=2048))
def test_random_bytes_never_crash(body: bytes) -> None:
    survives(body)


SDPISH = st.lists(
    st.tuples(
        st.sampled_from("vosctmaqbz=A1 "),
        st.text(alphabet=st.sampled_from("0123456789 :/=;.abcdefgHIJmrtpfx-\t"), max_size=40),
    ),
    max_size=30,
)


@given(SDPISH, st.sampled_from(["\r\n", "\n"]))
def test_sdp_like_text_never_crashes(lines: list[tuple[str, str]], eol: str) -> None:
    body = "v=0" + eol + eol.join(f"{t}={v}" for t, v in lines)
    survives(body.encode())


@given(st.sampled_from(GOOD_BODIES), st.data())
def test_truncated_offers_never_crash(body: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(body)))
    survives(body[:cut])


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(GOOD_BODIES), st.data())
def test_mutated_offers_never_crash(body: bytes, data: st.DataObject) -> None:
    lines = body.decode().splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "swap", "char", "insert"]))
        if op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "char" and lines[i]:
            k = data.draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:k] + data.draw(st.characters()) + lines[i][k + 1 :]
        elif op == "insert":
            lines.insert(i, data.draw(st.text(max_size=30)))
    survives("\r\n".join(lines).encode("utf-8", "surrogatepass"), max_bytes=1 << 20)


TOKEN = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
VALUE = st.from_regex(r"[A-Za-z0-9./-]{1,8}", fullmatch=True)
NAMES = st.one_of(
    st.sampled_from(["H264", "VP8", "VP9", "AV1", "H265", "opus", "OPUS", "rtx", "red", "PCMU"]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,8}", fullmatch=True),
)
H264_PARAMS = st.lists(
    st.sampled_from(
        [("packetization-mode", "1"), ("packetization-mode", "0"), ("profile-level-id", "42e01f"),
         ("profile-level-id", "640c1f"), ("profile-level-id", "f4001f"), ("apt", "96")]
    ),
    max_size=3,
    unique_by=lambda kv: kv[0],
)  # fmt: skip
PARAMS = st.one_of(
    H264_PARAMS, st.lists(st.tuples(TOKEN, VALUE), max_size=3, unique_by=lambda kv: kv[0])
)
CODEC = st.tuples(
    NAMES,
    st.sampled_from([8000, 48000, 90000, 16000]),
    st.sampled_from([None, 1, 2]),
    PARAMS,
)


@st.composite
def sections(draw: st.DrawFn) -> tuple[str, str, list[Codec]]:
    kind = draw(st.sampled_from(["audio", "video"]))
    direction = draw(st.sampled_from(["sendonly", "sendrecv", "recvonly"]))
    pts = draw(st.lists(st.integers(0, 127), min_size=1, max_size=6, unique=True))
    codecs = [
        Codec(pt, n, c, ch, tuple(p))
        for pt, (n, c, ch, p) in zip(
            pts, draw(st.lists(CODEC, min_size=len(pts), max_size=len(pts))), strict=True
        )
    ]
    return kind, direction, codecs


def render(section: tuple[str, str, list[Codec]], mid: int) -> str:
    kind, direction, codecs = section
    lines = [f"m={kind} 9 UDP/TLS/RTP/SAVPF {' '.join(str(c.payload_type) for c in codecs)}"]
    lines += [f"a=mid:m{mid}", f"a={direction}"]
    for c in codecs:
        channels = f"/{c.channels}" if c.channels is not None else ""
        lines.append(f"a=rtpmap:{c.payload_type} {c.name}/{c.clock_rate}{channels}")
        if c.params:
            lines.append(f"a=fmtp:{c.payload_type} " + ";".join(f"{k}={v}" for k, v in c.params))
    return "\r\n".join(lines) + "\r\n"


@given(st.lists(sections(), min_size=1, max_size=3))
def test_valid_offers_round_trip_their_codecs(
    generated: list[tuple[str, str, list[Codec]]],
) -> None:
    body = minimal(*(render(s, i) for i, s in enumerate(generated)))
    parsed = parse_offer(body)
    assert [list(m.codecs) for m in parsed.media] == [codecs for _, _, codecs in generated]
    assert [(m.kind, m.direction.value, m.mid) for m in parsed.media] == [
        (kind, direction, f"m{i}") for i, (kind, direction, _) in enumerate(generated)
    ]
    try:
        summary = check_offer(body)
    except (TooManyTracksError, NothingReceivableError):
        return
    for plan, (kind, direction, codecs) in zip(summary.sections, generated, strict=True):
        kept = [c for c in codecs if receivable(kind, c)]
        if kind == "video":  # the server's preference first, then the offer's order
            kept.sort(key=lambda c: DEFAULT_VIDEO_CODECS.index(video_format(c) or ""))
        expected = tuple(c.payload_type for c in kept)
        if direction == "recvonly":
            expected = ()
        assert plan.payload_types == expected
        assert plan.accepted is bool(expected)
        assert set(plan.rtx_payload_types) <= {
            c.payload_type for c in codecs if c.encoding == "rtx"
        }


# --- the real media stack accepts the fixtures, and its answers finalize ------------------


@pytest.mark.parametrize("name", GOOD)
async def test_aiortc_answers_finalize(name: str) -> None:
    from aiortc import RTCSessionDescription

    from whip.rtc.peer import new_peer_connection

    summary = check_offer(offer(name))
    pc = new_peer_connection()
    try:
        await pc.setRemoteDescription(RTCSessionDescription(offer(name).decode(), "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        final = finalize_answer(pc.localDescription.sdp, summary, ["127.0.0.1"])
    finally:
        await pc.close()
    parsed = parse_description(final)
    for plan, section in zip(summary.sections, parsed.media, strict=True):
        if section.port == 0:
            continue
        assert plan.accepted and section.direction is Direction.RECVONLY
        kept = {*plan.payload_types, *plan.rtx_payload_types}
        assert {int(f) for f in section.formats} <= kept
        assert section.codecs[0].payload_type in plan.payload_types
    assert any(
        " 127.0.0.1 " in line for line in final.split("\r\n") if line.startswith("a=candidate:")
    ) or not any(line.startswith("a=candidate:") for line in final.split("\r\n"))
    assert ipaddress.ip_address("127.0.0.1")
