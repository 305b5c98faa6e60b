"""whip.rtc.layer_size: a layer's picture size from one RTP payload, for every video codec.

The payloads are real: PyAV-encoded frames at odd sizes (the encoders crop or pad them)
packetized by FFmpeg's RTP muxer (``bench/support/rtp_reference.py``) at MTUs that make it
aggregate, send alone or fragment the parameter sets, and by aiortc's H.264 packetizer.
Each size is checked against FFmpeg's decoder. Framings no packetizer here writes (H.265
DONL, AV1 W=0 and size fields, the VP9 scalability structure) are built around real
parameter sets and frames. Random and mutated bytes never raise."""

from __future__ import annotations

import fractions
import functools
import random

import av
import numpy as np
import pytest
from aiortc.codecs.h264 import H264Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.support.rtp_reference import (
    SETUPS,
    RtpPacket,
    decode,
    packetize,
    reference_stream,
)
from pipeline.av1_obu import leb128
from pipeline.rtp_payload import vp9
from whip.rtc.layer_size import (
    SizeReader,
    av1_payload_size,
    h264_payload_size,
    h265_payload_size,
    h265_payload_size_with_donl,
    size_reader,
    vp8_keyframe_size,
    vp9_payload_size,
)

READERS: dict[str, SizeReader] = {
    "H264": h264_payload_size,
    "H265": h265_payload_size,
    "AV1": av1_payload_size,
    "VP9": vp9_payload_size,
}
ODD_SIZES = [(1278, 718), (642, 362)]
FRAMES = 12
"""Two keyframes at each encoder's interval of 10."""


def _first_nal_type(codec: str, payload: bytes) -> int:
    return payload[0] & 0x1F if codec == "H264" else (payload[0] >> 1) & 0x3F


@pytest.mark.parametrize(("width", "height"), ODD_SIZES)
@pytest.mark.parametrize(
    ("codec", "mtu", "carrier"),
    [
        ("H264", 1200, 24),  # SPS and PPS in one STAP-A
        ("H264", 40, 7),  # the SPS alone
        ("H264", 28, 28),  # the SPS cut in FU-A fragments
        ("H265", 1200, 48),  # VPS, SPS, PPS in one aggregation packet
        ("H265", 40, 49),  # the SPS cut in fragmentation units
        ("AV1", 1200, None),
        ("AV1", 240, None),
        ("VP9", 1200, None),
        ("VP9", 240, None),
    ],
)
def test_every_keyframe_gives_the_size_and_no_other_packet_does(
    codec: str, mtu: int, carrier: int | None, width: int, height: int
) -> None:
    stream = reference_stream(codec, count=FRAMES, width=width, height=height, mtu=mtu)
    read = READERS[codec]
    found = [(packet, read(packet.payload)) for packet in stream.rtp]
    sized = [(packet, size) for packet, size in found if size is not None]
    assert {size for _, size in sized} == {(width, height)}
    assert len(sized) == sum(stream.keyframes) == 2
    if carrier is not None:  # the packetization this case is about was the one read
        assert {_first_nal_type(codec, packet.payload) for packet, _ in sized} == {carrier}


@pytest.mark.parametrize("codec", list(READERS))
def test_the_size_read_is_the_decoders(codec: str) -> None:
    """FFmpeg's decoder (its own SPS / sequence header / frame header parser) agrees."""
    stream = reference_stream(codec, count=FRAMES, width=642, height=362, mtu=1200)
    pictures = decode(codec, stream.frames)
    assert {(w, h) for w, h, _ in pictures} == {(642, 362)}


def _encode(
    encoder: str, options: dict[str, str], width: int, height: int, pix_fmt: str
) -> list[av.Packet]:
    context = av.CodecContext.create(encoder, "w")
    context.width, context.height, context.pix_fmt = width, height, pix_fmt
    context.time_base = fractions.Fraction(1, 30)
    context.framerate = fractions.Fraction(30)
    context.options = options
    packets: list[av.Packet] = []
    rng = np.random.default_rng(width)
    for index in range(3):
        rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=pix_fmt)
        frame.pts = index
        frame.time_base = fractions.Fraction(1, 30)
        packets += context.encode(frame)
    return packets + list(context.encode(None))


def _decoded_size(codec: str, packets: list[av.Packet]) -> set[tuple[int, int]]:
    """The picture sizes FFmpeg's decoder makes of ``packets`` (any pixel format)."""
    context = av.CodecContext.create(SETUPS[codec].decoder, "r")
    sizes = set()
    for packet in [*packets, None]:
        for picture in context.decode(packet):
            sizes.add((picture.width, picture.height))
    return sizes


X264 = {"preset": "ultrafast", "bf": "0"}
X265 = {"preset": "ultrafast", "x265-params": "log-level=error:bframes=0"}
VPX = {"deadline": "realtime", "cpu-used": "8"}


@pytest.mark.parametrize(
    ("codec", "encoder", "options", "pix_fmt", "size"),
    [
        # 4:4:4: crop units of one sample (H.264 7.4.2.1.1, H.265 table 6-1)
        ("H264", "libx264", X264, "yuv444p", (641, 361)),
        ("H265", "libx265", X265, "yuv444p", (641, 361)),
        # field coding: frame_mbs_only_flag 0, map units of two macroblock rows
        ("H264", "libx264", {**X264, "x264-params": "interlaced=1"}, "yuv420p", (642, 364)),
        # 4:2:2: crop units of two samples across, one down
        ("H264", "libx264", X264, "yuv422p", (642, 361)),
        # VP9 profile 1: the color_config with subsampling bits
        ("VP9", "libvpx-vp9", VPX, "yuv444p", (641, 361)),
    ],
)
def test_chroma_formats_and_field_coding(
    codec: str, encoder: str, options: dict[str, str], pix_fmt: str, size: tuple[int, int]
) -> None:
    packets = _encode(encoder, options, *size, pix_fmt)
    assert _decoded_size(codec, packets) == {size}
    rtp = packetize(codec, packets, *size, pix_fmt=pix_fmt)
    assert {READERS[codec](p.payload) for p in rtp} == {size, None}


@functools.cache
def _parameter_sets(codec: str) -> dict[int, bytes]:
    """NAL type -> the first NAL unit of that type (header included) in the stream's IDR."""
    annexb = reference_stream(codec, count=FRAMES, width=642, height=362).frames[0]
    units: dict[int, bytes] = {}
    for chunk in annexb.split(b"\x00\x00\x01")[1:]:
        unit = chunk.rstrip(b"\x00")
        units.setdefault(_first_nal_type(codec, unit), unit)
    return units


def test_h264_from_aiortcs_packetizer() -> None:
    """aiortc's encoder (libx264) and packetizer: SPS and PPS in a STAP-A."""
    encoder = H264Encoder()
    image = np.zeros((362, 642, 3), np.uint8)
    frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
    frame.pts, frame.time_base = 0, fractions.Fraction(1, 90_000)
    payloads, _ = encoder.encode(frame, force_keyframe=True)
    assert payloads[0][0] & 0x1F == 24
    assert [h264_payload_size(p) for p in payloads] == [(642, 362)] + [None] * (len(payloads) - 1)


def test_an_h264_fu_a_start_too_short_for_the_size_is_none() -> None:
    sps = _parameter_sets("H264")[7]
    fu_indicator, fu_header = (sps[0] & 0xE0) | 28, 0x80 | 7
    assert h264_payload_size(bytes([fu_indicator, fu_header]) + sps[1:]) == (642, 362)
    assert h264_payload_size(bytes([fu_indicator, fu_header]) + sps[1:5]) is None
    assert h264_payload_size(bytes([fu_indicator, 7]) + sps[1:]) is None  # not the start


def test_h265_with_donl_fields() -> None:
    units = _parameter_sets("H265")
    vps, sps, pps = units[32], units[33], units[34]
    donl = b"\x00\x07"
    single = sps[:2] + donl + sps[2:]
    ap_header = bytes([48 << 1, 0x01])
    ap = ap_header + donl + len(vps).to_bytes(2) + vps
    ap += b"\x00" + len(sps).to_bytes(2) + sps + b"\x00" + len(pps).to_bytes(2) + pps
    fu = bytes([49 << 1, 0x01, 0x80 | 33]) + donl + sps[2:]
    for payload in (single, ap, fu):
        assert h265_payload_size_with_donl(payload) == (642, 362)
    reader = size_reader("video/H265", {"sprop-max-don-diff": "2"})
    assert reader is h265_payload_size_with_donl
    assert size_reader("video/H265", {}) is h265_payload_size
    plain_ap = ap_header + b"".join(len(u).to_bytes(2) + u for u in (vps, sps, pps))
    assert h265_payload_size(plain_ap) == (642, 362)


@functools.cache
def _av1_sequence_header_obu() -> bytes:
    """The sequence header OBU (header, no size field) of FFmpeg's first AV1 packet."""
    first = reference_stream("AV1", count=FRAMES, width=642, height=362).rtp[0].payload
    assert first[0] & 0x30 == 0x20  # W=2: a length, then the last element
    length = first[1]
    obu = first[2 : 2 + length]
    assert obu[0] >> 3 & 0x0F == 1 and not obu[0] & 0x02
    return obu


def test_av1_element_framings() -> None:
    obu = _av1_sequence_header_obu()
    frame_obu = bytes([6 << 3]) + bytes(20)
    delimiter = bytes([2 << 3])
    sized = bytes([obu[0] | 0x02]) + leb128(len(obu) - 1) + obu[1:]
    cases = [
        b"\x00" + leb128(len(obu)) + obu + leb128(len(frame_obu)) + frame_obu,  # W=0
        b"\x10" + obu,  # W=1: one element, no length
        b"\x30" + leb128(1) + delimiter + leb128(len(obu)) + obu + frame_obu,  # W=3, TD first
        b"\x10" + sized,  # obu_has_size_field set
        b"\xa0" + leb128(3) + b"\x00\x00\x00" + obu,  # Z: the continued first is skipped
    ]
    assert [av1_payload_size(p) for p in cases] == [(642, 362)] * len(cases)
    assert av1_payload_size(b"\x20" + leb128(len(frame_obu)) + frame_obu + obu) is None
    assert av1_payload_size(b"\x90" + obu) is None  # Z with one element: a continuation


def _vp9_keyframe() -> bytes:
    return reference_stream("VP9", count=FRAMES, width=642, height=362).frames[0]


def test_vp9_scalability_structure() -> None:
    frame = _vp9_keyframe()
    two_layers = bytes([1 << 5 | 0x10, 0, 160, 0, 90, 1, 64, 0, 180])  # N_S=1, Y
    with_ss = bytes([vp9.B_BIT | vp9.V_BIT | vp9.P_BIT]) + two_layers + frame[:100]
    assert vp9_payload_size(with_ss) == (320, 180)  # the SS wins, even on an inter frame
    no_sizes = bytes([vp9.B_BIT | vp9.V_BIT, 0x08, 0]) + frame[:100]  # G only, N_G 0
    assert vp9_payload_size(no_sizes) == (642, 362)  # the keyframe header then
    zero = bytes([vp9.B_BIT | vp9.V_BIT, 0x10, 0, 0, 0, 0]) + frame[:100]
    assert vp9_payload_size(zero) is None
    inter = bytes([vp9.B_BIT | vp9.P_BIT]) + frame[:100]
    assert vp9_payload_size(inter) is None  # the sender says inter: not read
    middle = bytes([0]) + frame[:100]
    assert vp9_payload_size(middle) is None


def _bits(*fields: tuple[int, int]) -> bytes:
    """``(value, bit count)`` fields, MSB first, zero-padded to whole bytes."""
    value = count = 0
    for field, width in fields:
        value, count = value << width | field, count + width
    pad = -count % 8
    return (value << pad).to_bytes((count + pad) // 8)


@pytest.mark.parametrize("profile", [2, 3])
def test_vp9_high_bit_depth_keyframe_headers(profile: int) -> None:
    """Profiles 2 and 3 (libvpx here is built without them): VP9 6.2 written bit by bit;
    profile 3's reserved bit moves the sync code off the byte boundary."""
    reserved = [(0, 1)] if profile == 3 else []
    subsampling = [(0, 3)] if profile == 3 else []
    header = _bits(
        (2, 2),  # frame_marker
        (profile & 1, 1),
        (profile >> 1, 1),
        *reserved,
        (0, 1),  # show_existing_frame
        (0, 1),  # frame_type KEY_FRAME
        (1, 1),  # show_frame
        (0, 1),  # error_resilient_mode
        (0x498342, 24),
        (0, 1),  # ten_or_twelve_bit
        (1, 3),  # color_space BT_601
        (0, 1),  # color_range
        *subsampling,
        (640, 16),  # frame_width_minus_1
        (359, 16),
    )
    payload = bytes([vp9.B_BIT | vp9.E_BIT]) + header + bytes(40)
    assert vp9_payload_size(payload) == (641, 360)
    inter = bytearray(header)
    inter[0] |= 0x02 if profile == 3 else 0x04  # frame_type NON_KEY_FRAME
    assert vp9_payload_size(bytes([vp9.B_BIT]) + bytes(inter) + bytes(40)) is None


def test_size_reader_by_mime_type() -> None:
    assert size_reader("video/VP8", {}) is vp8_keyframe_size
    assert size_reader("VIDEO/h264", {"packetization-mode": "1"}) is h264_payload_size
    assert size_reader("video/AV1", {}) is av1_payload_size
    assert size_reader("video/VP9", {}) is vp9_payload_size
    assert size_reader("video/H265", {"sprop-max-don-diff": "x"}) is h265_payload_size
    assert size_reader("audio/opus", {}) is None


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL_READERS = [*READERS.values(), h265_payload_size_with_donl, vp8_keyframe_size]
PREFIXES = [
    b"\x67",  # H.264 SPS
    b"\x18",  # STAP-A
    b"\x7c\x87",  # FU-A start of an SPS
    b"\x42\x01",  # H.265 SPS
    b"\x60\x01",  # AP
    b"\x62\x01\xa1",  # FU start of an SPS
    b"\x00",  # AV1 W=0
    b"\x10\x08",  # AV1 W=1, a sequence header
    b"\x20\x0c\x08",  # AV1 W=2
    b"\x0a",  # VP9 B, V
    b"\x08\x82\x49\x83\x42",  # VP9 B, a keyframe's start
]


def _sane(size: tuple[int, int] | None) -> bool:
    return size is None or (0 < size[0] <= 1 << 32 and 0 < size[1] <= 1 << 32)


@FUZZ
@given(st.binary(max_size=120))
def test_random_payloads_never_raise(payload: bytes) -> None:
    for read in ALL_READERS:
        assert _sane(read(payload))


@FUZZ
@given(st.sampled_from(PREFIXES), st.binary(max_size=120))
def test_payloads_that_look_like_a_parameter_set_never_raise(prefix: bytes, rest: bytes) -> None:
    for read in ALL_READERS:
        assert _sane(read(prefix + rest))


def _carriers() -> list[RtpPacket]:
    out = []
    for codec, read in READERS.items():
        for mtu in (1200, 40):
            stream = reference_stream(codec, count=FRAMES, width=642, height=362, mtu=mtu)
            out += [p for p in stream.rtp if read(p.payload) is not None]
    return out


@FUZZ
@given(st.data())
def test_mutated_real_carriers_never_raise(data: st.DataObject) -> None:
    carriers = _carriers_cached()
    payload = bytearray(data.draw(st.sampled_from(carriers)).payload)
    rng = random.Random(data.draw(st.integers(0, 1 << 32)))
    for _ in range(data.draw(st.integers(1, 8))):
        payload[rng.randrange(len(payload))] = rng.randrange(256)
    cut = data.draw(st.integers(0, len(payload)))
    for read in ALL_READERS:
        assert _sane(read(bytes(payload[:cut])))
        assert _sane(read(bytes(payload)))


_carriers_cached = functools.cache(_carriers)
