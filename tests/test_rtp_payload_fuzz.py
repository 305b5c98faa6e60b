"""Hostile input: random payloads and random mutations of FFmpeg's real packets never make
a depacketizer raise anything but :class:`PayloadError` (a ``ValueError``), the per-packet
output stays proportional to the payload, an assembled frame stays within the cap, and
the keyframe detectors take any bytes without raising."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.support.rtp_reference import reference_stream
from pipeline import keyframes
from pipeline.rtp_payload.av1 import Av1Depacketizer
from pipeline.rtp_payload.depacketizer import Depacketizer
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.fragments import HEADER_BYTES
from pipeline.rtp_payload.h265 import H265Depacketizer
from pipeline.rtp_payload.vp9 import Vp9Depacketizer

CAP = 4096
FACTORIES: dict[str, Callable[[], Depacketizer]] = {
    "H265": lambda: H265Depacketizer(max_frame_bytes=CAP),
    "H265-DONL": lambda: H265Depacketizer(donl=True, max_frame_bytes=CAP),
    "AV1": lambda: Av1Depacketizer(max_frame_bytes=CAP),
    "VP9": lambda: Vp9Depacketizer(max_frame_bytes=CAP),
}
STREAM_OF = {"H265": "H265", "H265-DONL": "H265", "AV1": "AV1", "VP9": "VP9"}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def try_packet(depacketizer: Depacketizer, payload: bytes) -> bytes | None:
    try:
        packet = depacketizer.depacketize(payload)
    except PayloadError:
        return None
    # Each element costs its header; an element holds at least 1 byte of payload, or a
    # 2-byte rebuilt/moved NAL header (H.265 FU start) or DON.
    assert len(packet.data) <= (HEADER_BYTES + 2) * max(len(payload), 1)
    return packet.data


def try_frame(depacketizer: Depacketizer, data: bytes) -> None:
    try:
        frame = depacketizer.assemble(data)
    except PayloadError as exc:
        assert exc.reason and exc.reason == exc.reason.lower()
        return
    assert 0 < len(frame.data) <= CAP


PREFIXES = {
    # Header bytes that steer random payloads into each structure of the format.
    "H265": [b"", b"\x40\x01", b"\x60\x01", b"\x62\x01", b"\x62\x01\x93", b"\x64\x01"],
    "AV1": [b"", b"\x00", b"\x10", b"\x20", b"\x30", b"\x48", b"\x80", b"\xc0"],
    "VP9": [b"", b"\x0c", b"\xff", b"\x0a", b"\x5c", b"\xac", b"\x9e"],
}
PREFIXES["H265-DONL"] = PREFIXES["H265"]


@pytest.mark.parametrize("name", FACTORIES)
@FUZZ
@given(data=st.data())
def test_random_payloads_raise_only_payload_errors(name: str, data: st.DataObject) -> None:
    payload = st.tuples(st.sampled_from(PREFIXES[name]), st.binary(max_size=200))
    payloads = data.draw(st.lists(payload.map(b"".join), min_size=1, max_size=6))
    depacketizer = FACTORIES[name]()
    outputs = [try_packet(depacketizer, p) for p in payloads]
    try_frame(depacketizer, b"".join(o for o in outputs if o is not None))
    assert sum(depacketizer.errors.values()) >= outputs.count(None)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("drop"), st.integers(0, 10_000), st.just(0)),
)


def mutate(payload: bytes, kind: str, where: int, value: int) -> bytes:
    if not payload:
        return bytes((value,))
    i = where % len(payload)
    if kind == "flip":
        return payload[:i] + bytes((payload[i] ^ value,)) + payload[i + 1 :]
    if kind == "cut":
        return payload[:i]
    if kind == "insert":
        return payload[:i] + bytes((value,)) + payload[i:]
    return payload[:i] + payload[i + 1 :]


@pytest.mark.parametrize("name", FACTORIES)
@FUZZ
@given(
    start=st.integers(0, 10_000),
    length=st.integers(1, 8),
    mutations=st.lists(st.tuples(st.integers(0, 7), mutation), min_size=1, max_size=4),
)
def test_mutated_real_packets_raise_only_payload_errors(
    name: str, start: int, length: int, mutations: list[tuple[int, tuple[str, int, int]]]
) -> None:
    rtp = reference_stream(STREAM_OF[name], mtu=240).rtp
    first = start % len(rtp)
    payloads = [p.payload for p in rtp[first : first + length]]
    for target, (kind, where, value) in mutations:
        i = target % len(payloads)
        payloads[i] = mutate(payloads[i], kind, where, value)
    depacketizer = FACTORIES[name]()
    outputs = [try_packet(depacketizer, p) for p in payloads]
    try_frame(depacketizer, b"".join(o for o in outputs if o is not None))


@pytest.mark.parametrize("name", FACTORIES)
@FUZZ
@given(data=st.binary(max_size=400))
def test_the_frame_step_takes_any_bytes(name: str, data: bytes) -> None:
    try_frame(FACTORIES[name](), data)


@pytest.mark.parametrize("codec", ["H265", "AV1", "VP9"])
def test_the_cap_holds_for_unmutated_frames_too(codec: str) -> None:
    # With a 4 KiB cap the reference keyframes (larger) are refused, the rest pass.
    stream = reference_stream(codec, mtu=240)
    depacketizer = FACTORIES[codec]()
    outcomes = set()
    timestamp = None
    current: list[bytes] = []
    for packet in [*stream.rtp, None]:
        if packet is None or (timestamp is not None and packet.timestamp != timestamp):
            try:
                depacketizer.assemble(b"".join(current))
                outcomes.add("ok")
            except PayloadError as exc:
                outcomes.add(exc.reason)
            current = []
        if packet is not None:
            timestamp = packet.timestamp
            current.append(depacketizer.depacketize(packet.payload).data)
    assert outcomes == {"ok", "frame_too_large"}


DETECTORS = [
    keyframes.h265_is_keyframe,
    keyframes.av1_is_keyframe,
    keyframes.vp9_is_keyframe,
    keyframes.h264_is_keyframe,
    keyframes.vp8_is_keyframe,
]


@settings(max_examples=1000, deadline=None)
@given(data=st.binary(max_size=256))
def test_keyframe_detectors_never_raise(data: bytes) -> None:
    for detect in DETECTORS:
        assert isinstance(detect(data), bool)
    for codec in ("H265", "HEVC", "AV1", "VP9", "av1", "vp9"):
        assert isinstance(keyframes.is_keyframe(codec, data), bool)
