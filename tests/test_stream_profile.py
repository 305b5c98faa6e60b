"""Bitstream readers: real encoders' parameter sets and sequence headers read right,
garbage never raises (pipeline.bitreader, pipeline.stream_profile)."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bitreader import BitReader, BitstreamError, strip_emulation_prevention
from pipeline.stream_profile import (
    StreamProfile,
    av1_level_name,
    h264_level_name,
    h264_profile_name,
    h265_level_name,
    read_stream_profile,
)


def encode(
    codec: str,
    options: dict[str, str],
    *,
    pix_fmt: str = "yuv420p",
    width: int = 320,
    height: int = 240,
    frames: int = 8,
) -> list[bytes]:
    """Encode a few grey frames with PyAV; the packets in decode order."""
    context = av.CodecContext.create(codec, "w")
    context.width, context.height, context.pix_fmt = width, height, pix_fmt
    context.time_base = fractions.Fraction(1, 30)
    context.framerate = fractions.Fraction(30)
    context.options = options
    packets: list[bytes] = []
    for i in range(frames):
        rgb = np.full((height, width, 3), (i * 29) % 255, np.uint8)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=pix_fmt)
        frame.pts = i
        packets += [bytes(p) for p in context.encode(frame)]
    packets += [bytes(p) for p in context.encode(None)]
    return packets


X264 = "log-level=error"
X265 = "log-level=error"

H264_CASES = [
    ({"profile": "baseline", "x264-params": X264}, "constrained-baseline", 0),
    ({"profile": "main", "x264-params": f"{X264}:bframes=0"}, "main", 0),
    ({"profile": "main", "x264-params": f"{X264}:bframes=2:b-pyramid=none"}, "main", 1),
    ({"profile": "high", "x264-params": f"{X264}:bframes=0"}, "high", 0),
    ({"profile": "high", "x264-params": f"{X264}:bframes=3:b-pyramid=normal"}, "high", 2),
]


@pytest.mark.parametrize(("options", "profile", "reorder"), H264_CASES)
def test_libx264_sps(options: dict[str, str], profile: str, reorder: int) -> None:
    packets = encode("libx264", options | {"level": "3.1"}, width=640, height=360)
    read = read_stream_profile("H264", packets[0])
    assert read == StreamProfile("H264", profile, "3.1", None, reorder, "vui")


def test_libx264_high10_and_level_4() -> None:
    packets = encode(
        "libx264",
        {"profile": "high10", "level": "4", "x264-params": f"{X264}:bframes=0"},
        pix_fmt="yuv420p10le",
    )
    read = read_stream_profile("H264", packets[0])
    assert read is not None
    assert (read.profile, read.level, read.reorder) == ("high10", "4", 0)


@pytest.mark.parametrize(
    ("params", "pix_fmt", "profile", "reorder"),
    [
        (f"{X265}:bframes=0:level-idc=3.1", "yuv420p", "main", 0),
        (f"{X265}:bframes=4:level-idc=4", "yuv420p", "main", 2),
        (f"{X265}:bframes=0:level-idc=4.1:high-tier=1", "yuv420p10le", "main10", 0),
    ],
)
def test_libx265_sps(params: str, pix_fmt: str, profile: str, reorder: int) -> None:
    packets = encode("libx265", {"x265-params": params}, pix_fmt=pix_fmt)
    read = read_stream_profile("H265", packets[0])
    assert read is not None
    level = params.split("level-idc=")[1].split(":")[0]
    assert (read.profile, read.level, read.reorder, read.reorder_source) == (
        profile,
        level.removesuffix(".0"),
        reorder,
        "sps",
    )
    # The same stream's VPS alone says the same profile and level.
    vps_only = _h265_nal_units(packets[0], {32})
    from_vps = read_stream_profile("H265", vps_only)
    assert from_vps is not None
    assert (from_vps.profile, from_vps.level, from_vps.tier) == (
        read.profile,
        read.level,
        read.tier,
    )


def test_libx265_high_tier() -> None:
    params = f"{X265}:bframes=0:level-idc=4.1:high-tier=1"
    read = read_stream_profile("H265", encode("libx265", {"x265-params": params})[0])
    assert read is not None
    assert read.tier == "high"


def _h265_nal_units(annexb: bytes, types: set[int]) -> bytes:
    out = b""
    for chunk in annexb.split(b"\x00\x00\x01")[1:]:
        if chunk and (chunk[0] >> 1) & 0x3F in types:
            out += b"\x00\x00\x00\x01" + chunk.rstrip(b"\x00")
    return out


@pytest.mark.parametrize(("width", "height", "level"), [(320, 240, "2.0"), (1280, 720, "3.1")])
def test_libsvtav1_sequence_header(width: int, height: int, level: str) -> None:
    # SVT-AV1 picks the smallest level that holds the picture size (AV1 spec A.3).
    packets = encode("libsvtav1", {"preset": "12"}, width=width, height=height, frames=2)
    read = read_stream_profile("AV1", packets[0])
    assert read == StreamProfile("AV1", "main", level, "main", None, "none")


@pytest.mark.parametrize(
    ("codec", "encoder", "decoder", "options"),
    [
        ("H264", "libx264", "h264", {"profile": "main", "level": "4.1"}),
        ("H264", "libx264", "h264", {"profile": "baseline", "level": "3"}),
        ("H265", "libx265", "hevc", {"x265-params": f"{X265}:level-idc=5.1"}),
    ],
)
def test_agrees_with_ffmpeg_parser(
    codec: str, encoder: str, decoder: str, options: dict[str, str]
) -> None:
    """FFmpeg's own SPS parser (the decoder's ``level``) reads the same level."""
    packets = encode(encoder, options, frames=2)
    read = read_stream_profile(codec, packets[0])
    context = av.CodecContext.create(decoder, "r")
    context.decode(av.Packet(packets[0]))
    assert read is not None and read.level is not None
    expected = context.level / (30 if codec == "H265" else 10)
    assert float(read.level) == expected


@pytest.mark.parametrize(
    ("pix_fmt", "profile"), [("yuv420p", "profile-0"), ("yuv444p", "profile-1")]
)
def test_libvpx_vp9_profile(pix_fmt: str, profile: str) -> None:
    packets = encode("libvpx-vp9", {"deadline": "realtime", "cpu-used": "8"}, pix_fmt=pix_fmt)
    for packet in packets:
        read = read_stream_profile("VP9", packet)
        assert read == StreamProfile("VP9", profile, None, None, None, "none")


def test_inter_frames_have_no_parameter_set() -> None:
    packets = encode("libx264", {"profile": "main", "x264-params": f"{X264}:bframes=0"})
    assert all(read_stream_profile("H264", p) is None for p in packets[1:])


def test_names() -> None:
    assert h264_profile_name(66, 0xE0) == "constrained-baseline"
    assert h264_profile_name(66, 0x00) == "baseline"
    assert h264_profile_name(100, 0x0C) == "constrained-high"
    assert h264_profile_name(100, 0x08) == "progressive-high"
    assert h264_profile_name(110, 0x10) == "high10-intra"
    assert h264_level_name(31, 0, 100) == "3.1"
    assert h264_level_name(11, 0x10, 66) == "1b"
    assert h264_level_name(11, 0x10, 100) == "1.1"
    assert h264_level_name(9, 0, 100) == "1b"
    assert h265_level_name(93) == "3.1"
    assert h265_level_name(120) == "4"
    assert av1_level_name(0) == "2.0"
    assert av1_level_name(13) == "5.1"
    assert av1_level_name(31) == "max"


def test_emulation_prevention_removed() -> None:
    assert strip_emulation_prevention(b"\x00\x00\x03\x01\x00\x00\x03") == b"\x00\x00\x01\x00\x00"
    # 00 00 03 03: only the first 03 is an emulation prevention byte.
    assert strip_emulation_prevention(b"\x00\x00\x03\x03") == b"\x00\x00\x03"
    assert strip_emulation_prevention(b"\x01\x03\x00\x03") == b"\x01\x03\x00\x03"


def test_exp_golomb() -> None:
    # 1 -> 0, 010 -> 1, 011 -> 2, 00100 -> 3; se: 010 -> 1, 011 -> -1
    reader = BitReader(bytes([0b10100110, 0b01000000]))
    assert [reader.ue(), reader.ue(), reader.ue(), reader.ue()] == [0, 1, 2, 3]
    signed = BitReader(bytes([0b01001100]))
    assert [signed.se(), signed.se()] == [1, -1]


def test_exp_golomb_bounded() -> None:
    with pytest.raises(BitstreamError) as too_long:
        BitReader(bytes(8)).ue()
    assert too_long.value.code == "exp_golomb_too_long"
    with pytest.raises(BitstreamError) as truncated:
        BitReader(b"\x00\x01").ue()
    assert truncated.value.code == "truncated"
    assert BitReader(bytes(5) + b"\xff").uvlc() == (1 << 32) - 1


@settings(max_examples=400, deadline=None)
@given(
    codec=st.sampled_from(["H264", "H265", "AV1", "VP9", "VP8", "opus"]),
    data=st.binary(max_size=300),
)
def test_garbage_never_raises(codec: str, data: bytes) -> None:
    read_stream_profile(codec, data)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=120), header=st.sampled_from([b"\x67", b"\x42\x01", b"\x40\x01"]))
def test_garbage_parameter_sets_never_raise(body: bytes, header: bytes) -> None:
    codec = "H264" if header == b"\x67" else "H265"
    read = read_stream_profile(codec, b"\x00\x00\x00\x01" + header + body)
    assert read is None or read.codec == codec


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=60))
def test_garbage_av1_sequence_header_never_raises(body: bytes) -> None:
    obu = bytes([0x0A, len(body)]) + body
    read = read_stream_profile("AV1", obu)
    assert read is None or read.codec == "AV1"


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0, max_value=60))
def test_truncated_real_sps_never_raises(cut: int) -> None:
    packet = _X264_HIGH[0]
    sps_end = packet.find(b"\x00\x00\x01", 5)
    read_stream_profile("H264", packet[: min(cut + 4, sps_end)])


_X264_HIGH = encode("libx264", {"profile": "high", "x264-params": f"{X264}:bframes=2"}, frames=2)
