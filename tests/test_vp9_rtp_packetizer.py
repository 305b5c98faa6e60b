"""The OBS-shaped publisher's VP9 packetizer (bench/support/vp9_rtp.py), read back by the
server's own RFC 9628 depacketizer: real libvpx-vp9 frames (realtime, as the capacity
bench encodes them) come out whole, key frames with the scalability structure and their
size, inter frames with P, a 15-bit picture id counting up, and the marker bit on each
frame's last packet. The real push through a server is in tests/test_codecs_obs.py."""

from __future__ import annotations

import fractions

import av

from bench.support.obs_like import ENCODERS
from bench.support.rtp_reference import decode, parse_rtp, pattern
from bench.support.vp9_rtp import Vp9Packetizer, keyframe_size
from pipeline.keyframes import vp9_is_keyframe as is_keyframe
from pipeline.rtp_payload.vp9 import Vp9Depacketizer, parse_descriptor

SIZE = (320, 180)


def _frames(count: int) -> list[bytes]:
    name, options = ENCODERS["vp9"]
    encoder = av.CodecContext.create(name, "w")
    encoder.width, encoder.height = SIZE
    encoder.pix_fmt = "yuv420p"
    encoder.time_base = fractions.Fraction(1, 30)
    encoder.framerate = fractions.Fraction(30, 1)
    encoder.gop_size = 10
    encoder.bit_rate = 1_500_000  # frames larger than one packet
    encoder.options = dict(options)
    packets: list[av.Packet] = []
    for index in range(count):
        packets += encoder.encode(pattern(index, *SIZE))
    packets += encoder.encode(None)
    return [bytes(packet) for packet in packets]


def test_libvpx_frames_survive_the_servers_depacketizer() -> None:
    frames = _frames(20)
    assert len(frames) == 20  # realtime, no alt-ref: one shown frame per picture
    assert [keyframe_size(f) is not None for f in frames] == [is_keyframe(f) for f in frames]
    assert [i for i, f in enumerate(frames) if is_keyframe(f)] == [0, 10]
    assert keyframe_size(frames[0]) == SIZE
    packetizer = Vp9Packetizer(1234, 96, max_payload=600, sequence=65530, picture_id=32766)
    depacketizer = Vp9Depacketizer()
    out: list[bytes] = []
    sequences: list[int] = []
    picture_ids: list[int | None] = []
    most_packets = 0
    for index, frame in enumerate(frames):
        datagrams = packetizer.packetize(frame, index * 3000)
        parsed = [parse_rtp(d) for d in datagrams]
        assert all(p is not None for p in parsed)
        packets = [p for p in parsed if p is not None]
        most_packets = max(most_packets, len(packets))
        assert all(len(p.payload) <= 600 for p in packets)
        assert [p.marker for p in packets] == [False] * (len(packets) - 1) + [True]
        assert {p.timestamp for p in packets} == {packetizer.rtp_timestamp(index * 3000)}
        assert {p.payload_type for p in packets} == {96}
        sequences += [p.sequence for p in packets]
        descriptors = [parse_descriptor(p.payload) for p in packets]
        assert [d.begins for d in descriptors] == [True] + [False] * (len(packets) - 1)
        assert [d.ends for d in descriptors] == [False] * (len(packets) - 1) + [True]
        assert not any(d.flexible or d.spatial_id is not None for d in descriptors)
        assert {d.inter_predicted for d in descriptors} == {not is_keyframe(frame)}
        picture_ids.append(descriptors[0].picture_id)
        first = descriptors[0].scalability
        if is_keyframe(frame):
            assert first is not None and first.resolutions == (SIZE,)
            assert first.spatial_layers == 1 and len(first.picture_group) == 1
        else:
            assert first is None
        assert all(d.scalability is None for d in descriptors[1:])
        elements = [depacketizer.depacketize(p.payload) for p in packets]
        assert elements[0].keyframe == is_keyframe(frame)
        assert all(e.frame_start == (i == 0) for i, e in enumerate(elements))
        assembled = depacketizer.assemble(b"".join(e.data for e in elements))
        assert assembled.data == frame
        assert assembled.keyframe_hint == is_keyframe(frame)
        out.append(assembled.data)
    assert most_packets > 1  # fragmented
    assert sequences == [(65530 + i) & 0xFFFF for i in range(len(sequences))]  # wraps
    assert picture_ids == [(32766 + i) & 0x7FFF for i in range(len(frames))]  # 15 bits
    pictures = decode("VP9", out)
    assert len(pictures) == len(frames)
    assert {(w, h) for w, h, _ in pictures} == {SIZE}
