"""whip.rtc.codec_table: H.265, AV1 and VP9 in aiortc's table once, H.264 matched whatever
its profile, and the offer's payload types 35-63 kept in the answer."""

from __future__ import annotations

import aiortc.codecs
import aiortc.rtcpeerconnection
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from whip.rtc.codec_table import ADDED_FORMATS, compatible, install_video_codecs, installed


def _h264(plid: str, mode: int = 1) -> RTCRtpCodecParameters:
    return RTCRtpCodecParameters(
        mimeType="video/H264",
        clockRate=90000,
        payloadType=102,
        parameters={"packetization-mode": mode, "profile-level-id": plid},
    )


def test_install_adds_each_format_and_its_rtx_once() -> None:
    install_video_codecs()
    install_video_codecs()
    assert installed()
    video = aiortc.codecs.CODECS["video"]
    for mime, pt in ADDED_FORMATS.items():
        [entry] = [c for c in video if c.mimeType == mime]
        [rtx] = [c for c in video if c.mimeType == "video/rtx" and c.parameters["apt"] == pt]
        assert (entry.payloadType, rtx.payloadType, entry.clockRate) == (pt, pt + 1, 90000)
        assert {(f.type, f.parameter) for f in entry.rtcpFeedback} == {
            ("nack", None),
            ("nack", "pli"),
            ("goog-remb", None),
        }
    assert len({c.payloadType for c in video}) == len(video)


def test_h264_of_any_profile_matches_the_same_packetization_mode_only() -> None:
    local = _h264("42001f")
    for plid in ("4d001f", "640c1f", "6e0028", "7a0028", "f40032"):
        assert compatible(local, _h264(plid))
    assert not compatible(local, _h264("640c1f", mode=0))
    vp8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000, payloadType=97)
    assert compatible(vp8, vp8) and not compatible(vp8, local)


def test_the_offers_payload_types_below_64_are_answered_as_offered() -> None:
    install_video_codecs()
    remote = [
        RTCRtpCodecParameters(mimeType="video/AV1", clockRate=90000, payloadType=45),
        RTCRtpCodecParameters(
            mimeType="video/rtx", clockRate=90000, payloadType=46, parameters={"apt": 45}
        ),
        _h264("4d001f"),
    ]
    common = aiortc.rtcpeerconnection.find_common_codecs(aiortc.codecs.CODECS["video"], remote)
    assert [(c.mimeType, c.payloadType) for c in common] == [
        ("video/AV1", 45),
        ("video/rtx", 46),
        ("video/H264", 102),
    ]
