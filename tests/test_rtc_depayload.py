"""whip.rtc.depayload: aiortc's per-packet ``depayload`` replaced for H.265, AV1 and VP9
only, one depacketizer per codec object bound from the offered fmtp, and the frame step in
front of the sink (lost frames counted, never passed on)."""

from __future__ import annotations

import aiortc.codecs
import aiortc.rtcrtpreceiver
import pytest
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from bench.support.rtp_reference import reference_stream
from pipeline.rtp_payload.h265 import H265Depacketizer
from whip.rtc.depayload import PayloadFormats, depayload, install_depayload, installed


def _codec(mime: str, pt: int) -> RTCRtpCodecParameters:
    return RTCRtpCodecParameters(mimeType=mime, clockRate=90000, payloadType=pt)


def test_install_is_idempotent_and_leaves_other_codecs_to_aiortc() -> None:
    install_depayload()
    install_depayload()
    assert installed() and aiortc.rtcrtpreceiver.depayload is depayload  # type: ignore[attr-defined]
    h264 = _codec("video/H264", 102)
    stap = bytes([24, 0, 2, 0x67, 0x42, 0, 2, 0x68, 0xCE])  # STAP-A: SPS + PPS
    assert depayload(h264, stap) == aiortc.codecs.depayload(h264, stap)
    unbound = _codec("video/H265", 96)  # no PayloadFormats bound it: aiortc's pass-through
    assert depayload(unbound, b"\x02\x01abc") == b"\x02\x01abc"


def test_bind_uses_the_offered_fmtp_one_depacketizer_per_codec_object() -> None:
    h265, av1, h264 = _codec("video/H265", 96), _codec("video/AV1", 45), _codec("video/H264", 97)
    formats = PayloadFormats({96: {"sprop-max-don-diff": "2"}}, max_frame_bytes=1 << 20, label="t")
    formats.bind([h265, av1, h264])
    assert sorted(formats.by_payload_type) == [45, 96]
    h265_depacketizer = formats.by_payload_type[96]
    assert isinstance(h265_depacketizer, H265Depacketizer) and h265_depacketizer.donl
    other = PayloadFormats({}, max_frame_bytes=1 << 20, label="u")
    other.bind([_codec("video/AV1", 45)])
    assert other.by_payload_type[45] is not formats.by_payload_type[45]
    with pytest.raises(ValueError):
        depayload(av1, b"")  # an empty AV1 payload: refused, so aiortc drops the packet
    assert formats.errors() == {"AV1": {"truncated": 1}}


@pytest.mark.parametrize("codec", ["H265", "AV1", "VP9"])
def test_the_frame_step_assembles_or_loses_the_frame(codec: str) -> None:
    stream = reference_stream(codec, count=4)
    params = _codec(f"video/{codec}", 96)
    formats = PayloadFormats({}, max_frame_bytes=1 << 20, label="t")
    formats.bind([params])
    got: list[tuple[int, bytes]] = []
    lost: list[int] = []
    sink = formats.framing(lambda c, f: got.append((f.timestamp, f.data)), lambda: lost.append(1))
    first = stream.rtp[0].timestamp
    joined = b"".join(depayload(params, p.payload) for p in stream.rtp if p.timestamp == first)
    sink(params, JitterFrame(data=joined, timestamp=7))
    assert [ts for ts, _ in got] == [7] and got[0][1] and not lost
    sink(params, JitterFrame(data=b"\xff" * 3, timestamp=8))  # not this format's elements
    assert len(got) == 1 and lost == [1] and formats.lost_frames == 1
    assert sum(formats.errors()[codec].values()) == 1
    h264 = _codec("video/H264", 97)  # no depacketizer: passed through untouched
    sink(h264, JitterFrame(data=b"\x00\x00\x00\x01\x65", timestamp=9))
    assert got[-1] == (9, b"\x00\x00\x00\x01\x65")
