"""AV1 depacketizer (AOM AV1 RTP payload format v1.0) on packets crafted from the spec's
figures (4.4, 4.5), with real OBUs from libsvtav1: W = 0 and W = 1..3, OBUs fragmented
over 3+ packets (Z/Y), the N bit, senders that keep ``obu_size``, dropped OBUs, OBU
extension headers, and every refusal with its reason."""

from __future__ import annotations

import pytest

from bench.support.rtp_reference import decode, reference_stream
from pipeline.av1_obu import leb128, read_leb128
from pipeline.rtp_payload.av1 import Av1Depacketizer
from pipeline.rtp_payload.errors import PayloadError

Obu = tuple[int, bytes, bytes]
"""(first header byte without obu_has_size_field, extension byte or b"", payload)."""


def split_temporal_unit(tu: bytes) -> list[Obu]:
    """The OBUs of a low-overhead temporal unit, temporal delimiter left out."""
    obus: list[Obu] = []
    offset = 0
    while offset < len(tu):
        first = tu[offset]
        ext = tu[offset + 1 : offset + 2] if first & 0x04 else b""
        size, start = read_leb128(tu, offset + 1 + len(ext))
        if (first >> 3) & 0x0F != 2:
            obus.append((first & ~0x02, ext, tu[start : start + size]))
        offset = start + size
    return obus


def low_overhead(obus: list[Obu]) -> bytes:
    """What the frame step must return: a temporal delimiter, then each OBU with its size."""
    out = bytearray(b"\x12\x00")
    for first, ext, payload in obus:
        out += bytes((first | 0x02,)) + ext + leb128(len(payload)) + payload
    return bytes(out)


def packetize(obus: list[Obu], mtu: int, w: int, *, n: bool = False) -> list[bytes]:
    """RTP payloads for one temporal unit (spec 4.4/4.5): OBU elements filling ``mtu``
    bytes, fragmenting where needed. ``w`` = 0: every element has a length; else each
    packet holds at most ``w`` elements, the last one without a length."""
    elements = [bytes((first,)) + ext + payload for first, ext, payload in obus]
    packets: list[bytes] = []
    continuing = False
    queue = list(elements)
    while queue:
        body = bytearray()
        count = 0
        first_continues = continuing
        last_continued = False
        room = mtu - 1
        while queue and room > 2 and (w == 0 or count < w):
            element = queue[0]
            last_slot = w != 0 and count == w - 1
            length_bytes = 0 if last_slot else len(leb128(min(len(element), room)))
            take = min(len(element), room - length_bytes)
            if take <= 0:
                break
            chunk, rest = element[:take], element[take:]
            if not last_slot:
                body += leb128(len(chunk))
            body += chunk
            count += 1
            room -= length_bytes + len(chunk)
            if rest:
                queue[0] = rest
                last_continued = True
                break
            queue.pop(0)
        if w != 0 and count < w:
            # The last element then carries its length implicitly only if it is the w-th:
            # re-encode with W = count so the rule holds.
            body = _recount(body, count)
            header_w = count
        else:
            header_w = w
        header = (
            (0x80 if first_continues else 0)
            | (0x40 if last_continued else 0)
            | (header_w << 4)
            | (0x08 if n and not packets else 0)
        )
        packets.append(bytes((header,)) + bytes(body))
        continuing = last_continued
    return packets


def _recount(body: bytearray, count: int) -> bytearray:
    """Elements that all carry lengths, re-encoded so the last one does not (W = count)."""
    out = bytearray()
    offset = 0
    for i in range(count):
        length, offset = read_leb128(bytes(body), offset)
        if i < count - 1:
            out += leb128(length)
        out += body[offset : offset + length]
        offset += length
    return out


def run(depacketizer: Av1Depacketizer, payloads: list[bytes]) -> bytes:
    return depacketizer.assemble(b"".join(depacketizer.depacketize(p).data for p in payloads)).data


def reference_units() -> list[bytes]:
    return list(reference_stream("AV1").frames)


@pytest.mark.parametrize("w", [0, 1, 2, 3])
@pytest.mark.parametrize("mtu", [90, 1200])
def test_every_temporal_unit_survives_crafted_packetization(w: int, mtu: int) -> None:
    depacketizer = Av1Depacketizer()
    frames = []
    spans = []
    for tu in reference_units():
        obus = split_temporal_unit(tu)
        payloads = packetize(obus, mtu, w)
        spans.append(len(payloads))
        out = run(depacketizer, payloads)
        assert out == low_overhead(obus)
        frames.append(out)
    if mtu == 90:
        assert max(spans) >= 3
    assert decode("AV1", frames) == decode("AV1", reference_units())
    assert depacketizer.errors == {}


def test_an_obu_over_many_packets_carries_z_and_y_through() -> None:
    obus = split_temporal_unit(reference_units()[0])
    payloads = packetize(obus, 60, 0)
    depacketizer = Av1Depacketizer()
    results = [depacketizer.depacketize(p) for p in payloads]
    flags = [(p[0] >> 7, (p[0] >> 6) & 1) for p in payloads]
    assert (1, 1) in flags  # a middle fragment: continues and is continued
    assert [(r.begins, r.ends) for r in results] == [(not z, not y) for z, y in flags]
    assert results[0].frame_start and not results[-1].ends_frame(marker=False)
    assert results[-1].ends_frame(marker=True)


def test_the_n_bit_is_the_payload_keyframe_flag() -> None:
    obus = split_temporal_unit(reference_units()[0])
    depacketizer = Av1Depacketizer()
    payloads = packetize(obus, 200, 0, n=True)
    results = [depacketizer.depacketize(p) for p in payloads]
    assert [r.keyframe for r in results] == [True] + [False] * (len(results) - 1)
    frame = depacketizer.assemble(b"".join(r.data for r in results))
    assert frame.keyframe_hint
    with pytest.raises(PayloadError) as caught:
        depacketizer.depacketize(bytes((0x80 | 0x08,)) + b"\x01\x0a")
    assert caught.value.reason == "n_with_z"


def test_obus_that_keep_their_size_field_are_taken_as_they_are() -> None:
    tu = reference_units()[1]
    obus = split_temporal_unit(tu)
    sized = [bytes((first | 0x02,)) + ext + leb128(len(p)) + p for first, ext, p in obus]
    payload = bytearray(b"\x00")
    for obu in sized:
        payload += leb128(len(obu)) + obu
    depacketizer = Av1Depacketizer()
    assert run(depacketizer, [bytes(payload)]) == low_overhead(obus)
    # A size field that disagrees with the element is refused at the frame step.
    wrong = bytes((0x30 | 0x02,)) + leb128(len(obus[0][2]) + 1) + obus[0][2]
    with pytest.raises(PayloadError) as caught:
        run(depacketizer, [b"\x00" + leb128(len(wrong)) + wrong])
    assert caught.value.reason == "obu_size_mismatch"


def test_temporal_delimiters_tile_lists_and_reserved_obus_are_dropped_and_counted() -> None:
    obus = split_temporal_unit(reference_units()[0])
    extra: list[Obu] = [(2 << 3, b"", b""), (8 << 3, b"", b"\x01\x02"), (10 << 3, b"", b"\x03")]
    depacketizer = Av1Depacketizer()
    out = run(depacketizer, packetize(extra[:1] + obus + extra[1:], 300, 0))
    assert out == low_overhead(obus)
    assert depacketizer.dropped == {"temporal_delimiter": 1, "tile_list": 1, "reserved_obu": 1}
    with pytest.raises(PayloadError) as caught:
        run(depacketizer, packetize(extra, 300, 0))
    assert caught.value.reason == "empty_frame"


def test_obu_extension_headers_are_kept() -> None:
    # temporal_id 0, spatial_id 0 on every OBU but the sequence header: the operating
    # point (idc 0) decodes them all, so the pictures stay the same.
    units = []
    for tu in reference_units():
        obus = [
            (first | 0x04, b"\x00", payload) if (first >> 3) & 0x0F != 1 else (first, ext, payload)
            for first, ext, payload in split_temporal_unit(tu)
        ]
        depacketizer = Av1Depacketizer()
        out = run(depacketizer, packetize(obus, 150, 2))
        assert out == low_overhead(obus)
        units.append(out)
    assert decode("AV1", units) == decode("AV1", reference_units())


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "truncated"),
        (b"\x00", "no_obu_elements"),
        (b"\x00" + b"\xff" * 8 + b"\x01", "leb128_too_long"),
        (b"\x00\x80", "leb128_truncated"),
        (b"\x00" + b"\xff\xff\xff\xff\x7f", "leb128_overflow"),
        (b"\x00\x05\x30\x00", "obu_element_length"),
        (b"\x00\x00", "empty_obu_element"),
        (b"\x20\x02\x30\x00", "obu_count_mismatch"),  # W=2, one element
        (b"\x30\x01\x30\x01\x30", "obu_count_mismatch"),  # W=3, two elements
        (b"\x88\x30", "n_with_z"),
    ],
)
def test_malformed_payloads_are_refused_with_their_reason(payload: bytes, reason: str) -> None:
    depacketizer = Av1Depacketizer()
    with pytest.raises(PayloadError) as caught:
        depacketizer.depacketize(payload)
    assert caught.value.reason == reason
    assert depacketizer.errors == {reason: 1}


@pytest.mark.parametrize(
    ("payloads", "reason"),
    [
        ([b"\x10\xb0"], "obu_forbidden_bit"),  # W=1, forbidden bit set
        ([b"\x10\x34"], "obu_truncated"),  # extension flag, no extension byte
        ([b"\x10\x32\x05"], "obu_size_mismatch"),  # obu_size 5, no payload
        ([b"\x50\x30\x00"], "frame_end_missing"),  # Y set on the last packet
        ([b"\x90\x00"], "frame_start_missing"),  # Z set on the first packet
        ([b"\x50\x30", b"\x10\x30"], "fragment_without_end"),  # Y, then no Z
        ([b"\x10\x30", b"\x90\x00"], "fragment_without_start"),  # no Y, then Z
    ],
)
def test_malformed_frames_are_refused_with_their_reason(payloads: list[bytes], reason: str) -> None:
    depacketizer = Av1Depacketizer()
    with pytest.raises(PayloadError) as caught:
        run(depacketizer, payloads)
    assert caught.value.reason == reason
