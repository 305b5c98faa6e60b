"""VP9 depacketizer (RFC 9628) on packets crafted from the RFC's descriptor figures (4.2,
4.2.1), with real frames from libvpx-vp9: flexible and non-flexible modes, the
scalability structure, spatial layers assembled into a superframe the decoder takes, and
every refusal with its reason."""

from __future__ import annotations

import pytest

from bench.support.rtp_reference import decode, reference_stream
from pipeline.rtp_payload import vp9
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.vp9 import (
    PictureGroupEntry,
    ScalabilityStructure,
    Vp9Depacketizer,
    build_superframe,
    parse_descriptor,
    split_superframe,
)

B, E, F, PID, L, P, V = (
    vp9.B_BIT,
    vp9.E_BIT,
    vp9.F_BIT,
    vp9.I_BIT,
    vp9.L_BIT,
    vp9.P_BIT,
    vp9.V_BIT,
)


def layer_byte(tid: int, u: bool, sid: int, d: bool) -> int:
    return tid << 5 | (0x10 if u else 0) | sid << 1 | (1 if d else 0)


SS_TWO_LAYERS = bytes(
    [
        (1 << 5) | 0x10 | 0x08,  # N_S = 1 (two layers), Y, G
        *(160).to_bytes(2),
        *(120).to_bytes(2),
        *(320).to_bytes(2),
        *(240).to_bytes(2),
        2,  # N_G
        (0 << 5) | 0x10 | (1 << 2),  # T=0, U, R=1
        4,  # P_DIFF 4
        (1 << 5) | (2 << 2),  # T=1, R=2
        1,
        2,
    ]
)


def test_flexible_mode_descriptor_with_every_field() -> None:
    payload = (
        bytes([PID | P | L | F | B | V, 0x80 | 0x12, 0x34, layer_byte(2, True, 1, True)])
        + bytes([(3 << 1) | 1, (5 << 1) | 1, 7 << 1])  # three P_DIFF, N on the first two
        + SS_TWO_LAYERS
        + b"\x82"
    )
    d = parse_descriptor(payload)
    assert (d.picture_id, d.flexible, d.inter_predicted, d.begins, d.ends) == (
        0x1234,
        True,
        True,
        True,
        False,
    )
    assert (d.temporal_id, d.switching_up, d.spatial_id, d.inter_layer_dependency) == (
        2,
        True,
        1,
        True,
    )
    assert d.tl0_picture_index is None
    assert d.reference_diffs == (3, 5, 7)
    assert d.scalability == ScalabilityStructure(
        2,
        ((160, 120), (320, 240)),
        (PictureGroupEntry(0, True, (4,)), PictureGroupEntry(1, False, (1, 2))),
    )
    assert payload[d.size :] == b"\x82"


def test_non_flexible_mode_descriptor_has_tl0picidx_and_7_bit_picture_ids() -> None:
    payload = bytes([PID | L | B | E, 0x55, layer_byte(0, False, 0, False), 0x9A]) + b"\x82"
    d = parse_descriptor(payload)
    assert (d.picture_id, d.flexible, d.temporal_id, d.spatial_id, d.tl0_picture_index) == (
        0x55,
        False,
        0,
        0,
        0x9A,
    )
    assert d.reference_diffs == () and d.scalability is None and d.size == 4
    minimal = parse_descriptor(bytes([B | E, 0x82]))
    assert minimal.picture_id is None and minimal.spatial_id is None and minimal.size == 1


def test_the_latest_scalability_structure_is_kept() -> None:
    depacketizer = Vp9Depacketizer()
    assert depacketizer.scalability is None
    depacketizer.depacketize(bytes([PID | B | E | V, 0x01]) + SS_TWO_LAYERS + b"\x82")
    assert depacketizer.scalability is not None
    assert depacketizer.scalability.resolutions == ((160, 120), (320, 240))
    depacketizer.depacketize(bytes([PID | B | E, 0x02, 0x82]))
    assert depacketizer.scalability.spatial_layers == 2


def split(frame: bytes, size: int) -> list[bytes]:
    return [frame[i : i + size] for i in range(0, len(frame), size)]


def layer_packets(
    frame: bytes, sid: int, *, inter: bool, flexible: bool, ss: bytes = b""
) -> list[bytes]:
    """One layer frame's packets (B on the first, E on the last), 7-bit picture id 9, and
    ``ss`` (a scalability structure) on the first packet when given."""
    chunks = split(frame, 300)
    out = []
    for i, chunk in enumerate(chunks):
        first = PID | L | (F if flexible else 0) | (P if inter else 0)
        first |= (B if i == 0 else 0) | (E if i == len(chunks) - 1 else 0)
        first |= V if ss and i == 0 else 0
        descriptor = bytes([first, 9, layer_byte(0, False, sid, sid > 0)])
        if flexible and inter:
            descriptor += bytes([1 << 1])
        elif not flexible:
            descriptor += b"\x00"  # TL0PICIDX
        if ss and i == 0:
            descriptor += ss
        out.append(descriptor + chunk)
    return out


@pytest.mark.parametrize("flexible", [True, False])
def test_two_spatial_layers_become_one_superframe_the_decoder_takes(flexible: bool) -> None:
    low = reference_stream("VP9", width=160, height=120).frames[0]
    high = reference_stream("VP9").frames[0]
    assert split_superframe(low) == [low] and split_superframe(high) == [high]
    payloads = layer_packets(low, 0, inter=False, flexible=flexible, ss=SS_TWO_LAYERS)
    payloads += layer_packets(high, 1, inter=False, flexible=flexible)
    depacketizer = Vp9Depacketizer()
    results = [depacketizer.depacketize(p) for p in payloads]
    assert depacketizer.scalability is not None
    assert depacketizer.scalability.resolutions == ((160, 120), (320, 240))
    assert [r.frame_start for r in results].count(True) == 1 and results[0].frame_start
    assert [r.keyframe for r in results] == [True] + [False] * (len(results) - 1)
    frame = depacketizer.assemble(b"".join(r.data for r in results))
    assert frame.keyframe_hint
    assert split_superframe(frame.data) == [low, high]
    assert [(w, h) for w, h, _ in decode("VP9", [frame.data])] == [(160, 120), (320, 240)]


def test_an_encoder_superframe_passes_through_or_is_merged() -> None:
    # libvpx-vp9 through PyAV sends hidden frames as packets of their own, so the
    # superframe an encoder could make is built here: a key frame and the next frame.
    stream = reference_stream("VP9")
    hidden = build_superframe([stream.frames[0], stream.frames[1]])
    assert decode("VP9", [hidden]) == decode("VP9", stream.frames[:2])
    depacketizer = Vp9Depacketizer()
    alone = layer_packets(hidden, 0, inter=True, flexible=True)
    assert (
        depacketizer.assemble(b"".join(depacketizer.depacketize(p).data for p in alone)).data
        == hidden
    )
    # The same superframe as the base layer of a two-layer picture: its frames are split
    # out and one index covers all three.
    extra = reference_stream("VP9", width=160, height=120).frames[1]
    payloads = alone + layer_packets(extra, 1, inter=True, flexible=True)
    frame = depacketizer.assemble(b"".join(depacketizer.depacketize(p).data for p in payloads))
    assert split_superframe(frame.data) == [*split_superframe(hidden), extra]
    assert not frame.keyframe_hint


def test_superframe_index_round_trip_and_limits() -> None:
    frames = [b"\x82" * 10, b"\x83" * 300, b"\x84" * 70000]
    assert split_superframe(build_superframe(frames)) == frames
    depacketizer = Vp9Depacketizer()
    payloads = [
        bytes([B | E | L, layer_byte(0, False, s % 8, False), 0]) + b"\x86" for s in range(9)
    ]
    with pytest.raises(PayloadError) as caught:
        depacketizer.assemble(b"".join(depacketizer.depacketize(p).data for p in payloads))
    assert caught.value.reason == "superframe_too_large"
    bad = build_superframe([b"\x82" * 10, b"\x83" * 10])
    bad = bad[:-4] + bytes([0xC1, 200, 10, 0xC1])
    with pytest.raises(PayloadError) as caught:
        split_superframe(bad)
    assert caught.value.reason == "bad_superframe_index"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "truncated"),
        (bytes([PID | B]), "truncated"),  # picture id missing
        (bytes([PID | B, 0x80]), "truncated"),  # 15-bit picture id cut
        (bytes([L | B]), "truncated"),  # layer indices missing
        (bytes([L | B, 0x00]), "truncated"),  # TL0PICIDX missing (non-flexible)
        (bytes([F | P | B]), "truncated"),  # P_DIFF missing
        (bytes([F | P | B, 0x03]), "truncated"),  # N set, next P_DIFF missing
        (bytes([F | P | B, 0x03, 0x05, 0x07, 0x09]), "too_many_p_diff"),
        (bytes([F | P | B, 0x00, 0x82]), "bad_p_diff"),
        (bytes([V | B, 0x10, 0x00]), "truncated"),  # Y with a cut resolution
        (bytes([V | B, 0x08]), "truncated"),  # G without N_G
        (bytes([V | B, 0x08, 0x01, 0x08]), "truncated"),  # R=2 without its P_DIFFs
        (bytes([B | E]), "no_payload"),
    ],
)
def test_malformed_payloads_are_refused_with_their_reason(payload: bytes, reason: str) -> None:
    depacketizer = Vp9Depacketizer()
    with pytest.raises(PayloadError) as caught:
        depacketizer.depacketize(payload)
    assert caught.value.reason == reason
    assert depacketizer.errors == {reason: 1}


@pytest.mark.parametrize(
    ("payloads", "reason"),
    [
        ([bytes([0, 0x82])], "frame_start_missing"),  # no B
        ([bytes([B, 0x82])], "frame_end_missing"),  # no E
        ([bytes([B, 0x82]), bytes([B | E, 0x82])], "fragment_without_end"),
        ([bytes([B | E, 0x82]), bytes([E, 0x82])], "fragment_without_start"),
    ],
)
def test_broken_layer_frames_are_refused_at_the_frame_step(
    payloads: list[bytes], reason: str
) -> None:
    depacketizer = Vp9Depacketizer()
    with pytest.raises(PayloadError) as caught:
        depacketizer.assemble(b"".join(depacketizer.depacketize(p).data for p in payloads))
    assert caught.value.reason == reason
