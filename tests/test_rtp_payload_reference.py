"""The depacketizers against a reference packetizer: FFmpeg's ``rtp`` muxer.

Real frames (libx265, libsvtav1, libvpx-vp9 through PyAV) are packetized by FFmpeg
(:mod:`bench.support.rtp_reference`), joined per RTP timestamp as aiortc's jitter buffer
does, assembled, and decoded with PyAV: the pictures must be the ones PyAV decodes from
the encoder's own packets (same count, sizes and planes), and the keyframe detectors must
agree with the encoder's keyframe flags. Then the same streams with packets lost at a
frame's edges: the frame step refuses the frame with the reason a metric would count.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket as AiortcRtpPacket

from bench.support.rtp_reference import (
    ReferenceStream,
    RtpPacket,
    decode,
    jitter_frames,
    reference_stream,
)
from pipeline.keyframes import is_keyframe
from pipeline.rtp_payload.depacketizer import Depacketizer
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.formats import depacketizer_for

CODECS = ["H265", "AV1", "VP9"]


def assembled(stream: ReferenceStream, packets: tuple[RtpPacket, ...] | None = None) -> list[bytes]:
    depacketizer = depacketizer_for(stream.codec, {})
    assert depacketizer is not None
    joined = jitter_frames(stream.rtp if packets is None else packets, _per_packet(depacketizer))
    return [depacketizer.assemble(data).data for _, data in joined]


def _per_packet(depacketizer: Depacketizer) -> Callable[[bytes], bytes]:
    return lambda payload: depacketizer.depacketize(payload).data


@pytest.mark.parametrize("mtu", [1200, 240])
@pytest.mark.parametrize("codec", CODECS)
def test_decoded_pictures_match_the_encoders_packets(codec: str, mtu: int) -> None:
    stream = reference_stream(codec, mtu=mtu)
    frames = assembled(stream)
    # One frame per encoder packet: FFmpeg gives each packet its own RTP timestamp.
    assert len(frames) == len(stream.frames)
    reference = decode(codec, stream.frames)
    ours = decode(codec, frames)
    assert len(reference) == 30
    assert [(w, h) for w, h, _ in ours] == [(w, h) for w, h, _ in reference]
    assert ours == reference


@pytest.mark.parametrize("codec", CODECS)
def test_aiortcs_jitter_buffer_joins_the_per_packet_outputs(codec: str) -> None:
    # The receive path as aiortc runs it: packet._data from the per-packet step, its
    # video jitter buffer (512 packets), then our frame step on each JitterFrame.
    stream = reference_stream(codec, mtu=240)
    depacketizer = depacketizer_for(codec, {})
    assert depacketizer is not None
    buffer = JitterBuffer(capacity=512, is_video=True)
    frames = []
    for packet in stream.rtp:
        rtp = AiortcRtpPacket(
            payload_type=packet.payload_type,
            marker=int(packet.marker),
            sequence_number=packet.sequence,
            timestamp=packet.timestamp,
            payload=packet.payload,
        )
        rtp._data = depacketizer.depacketize(packet.payload).data  # type: ignore[attr-defined]
        pli, frame = buffer.add(rtp)
        assert not pli
        if frame is not None:
            frames.append(depacketizer.assemble(frame.data).data)
    # aiortc hands a frame over when the next timestamp starts: the last one stays.
    assert len(frames) == len(stream.frames) - 1
    assert decode(codec, frames) == decode(codec, stream.frames[:-1])


@pytest.mark.parametrize("codec", CODECS)
def test_small_packets_fragment_units_over_three_or_more_packets(codec: str) -> None:
    stream = reference_stream(codec, mtu=240)
    first_frame = [p for p in stream.rtp if p.timestamp == stream.rtp[0].timestamp]
    assert len(first_frame) >= 3  # the keyframe is spread over many packets
    depacketizer = depacketizer_for(codec, {})
    assert depacketizer is not None
    results = [depacketizer.depacketize(p.payload) for p in first_frame]
    assert results[0].frame_start
    assert [r.ends_frame(p.marker) for r, p in zip(results, first_frame, strict=True)] == [
        False
    ] * (len(first_frame) - 1) + [True]
    # Some packet both continues and is continued: a middle fragment.
    assert any(not r.begins and not r.ends for r in results)


@pytest.mark.parametrize("codec", CODECS)
def test_keyframes_are_detected_where_the_encoder_made_them(codec: str) -> None:
    stream = reference_stream(codec)
    frames = assembled(stream)
    expected = list(stream.keyframes)
    assert expected.count(True) >= 3
    assert [is_keyframe(codec, f) for f in frames] == expected
    assert [is_keyframe(codec, f) for f in stream.frames] == expected


def test_the_payload_keyframe_flag_is_a_claim_not_the_bitstream() -> None:
    # FFmpeg's VP9 packetizer never sets P, so every picture claims to be a keyframe; its
    # AV1 packetizer never sets N. The bitstream check is what the intake must use.
    vp9 = reference_stream("VP9")
    depacketizer = depacketizer_for("VP9", {})
    assert depacketizer is not None
    hints = [
        depacketizer.assemble(data).keyframe_hint
        for _, data in jitter_frames(vp9.rtp, _per_packet(depacketizer))
    ]
    assert all(hints) and not all(vp9.keyframes)
    av1 = reference_stream("AV1")
    depacketizer = depacketizer_for("AV1", {})
    assert depacketizer is not None
    assert not any(depacketizer.depacketize(p.payload).keyframe for p in av1.rtp)


def _fragmented_edge(stream: ReferenceStream, edge: str) -> int:
    """Position in ``stream.rtp`` of the first packet that is a frame's ``edge`` packet and
    is fragmented across that edge: a first packet whose last unit goes on in the next
    packet, or a last packet that continues the previous one."""
    depacketizer = depacketizer_for(stream.codec, {})
    assert depacketizer is not None
    rtp = stream.rtp
    results = [depacketizer.depacketize(p.payload) for p in rtp]
    for i in range(1, len(rtp) - 1):
        if edge == "first":
            first = rtp[i - 1].timestamp != rtp[i].timestamp
            if first and rtp[i + 1].timestamp == rtp[i].timestamp and not results[i].ends:
                return i
        elif rtp[i + 1].timestamp != rtp[i].timestamp and not results[i].begins:
            return i
    raise AssertionError(f"no frame of {stream.codec} is fragmented at its {edge} packet")


@pytest.mark.parametrize(
    ("edge", "reason"), [("first", "frame_start_missing"), ("last", "frame_end_missing")]
)
@pytest.mark.parametrize("codec", CODECS)
def test_a_frame_that_lost_an_edge_packet_is_refused_and_counted(
    codec: str, edge: str, reason: str
) -> None:
    stream = reference_stream(codec, mtu=240)
    lost = _fragmented_edge(stream, edge)
    packets = tuple(p for i, p in enumerate(stream.rtp) if i != lost)
    depacketizer = depacketizer_for(codec, {})
    assert depacketizer is not None
    joined = jitter_frames(packets, _per_packet(depacketizer))
    outcomes: list[tuple[int, str]] = []
    for timestamp, data in joined:
        try:
            depacketizer.assemble(data)
        except PayloadError as exc:
            outcomes.append((timestamp, exc.reason))
    assert outcomes == [(stream.rtp[lost].timestamp, reason)]
    assert depacketizer.errors == {reason: 1}
    assert depacketizer.frames == len(joined) - 1


@pytest.mark.parametrize("codec", CODECS)
def test_the_frame_cap_refuses_a_frame_over_it(codec: str) -> None:
    stream = reference_stream(codec)
    largest = max(len(f) for f in stream.frames)
    depacketizer = depacketizer_for(codec, {}, max_frame_bytes=largest // 2)
    assert depacketizer is not None
    joined = jitter_frames(stream.rtp, _per_packet(depacketizer))
    sizes = []
    for _, data in joined:
        try:
            sizes.append(len(depacketizer.assemble(data).data))
        except PayloadError as exc:
            assert exc.reason == "frame_too_large"
    assert depacketizer.errors["frame_too_large"] >= 1
    assert max(sizes) <= largest // 2
