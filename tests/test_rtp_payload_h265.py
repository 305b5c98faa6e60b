"""H.265 depacketizer (RFC 7798) on packets crafted from the RFC's figures, with real NAL
units from libx265: single NAL unit packets, APs, FUs, with and without DONL/DOND, PACI,
and every refusal with its reason."""

from __future__ import annotations

import pytest

from bench.support.rtp_reference import decode, reference_stream
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.formats import depacketizer_for
from pipeline.rtp_payload.h265 import H265Depacketizer, donl_from_fmtp

AP = b"\x60\x01"  # F=0, Type=48, LayerId=0, TID=1
FU = b"\x62\x01"  # Type=49
PACI = b"\x64\x01"  # Type=50


def nal_units(annexb: bytes) -> list[bytes]:
    """The NAL units of an Annex-B buffer (3- or 4-byte start codes)."""
    return [part.rstrip(b"\x00") for part in annexb.split(b"\x00\x00\x01")[1:]]


def first_access_unit() -> list[bytes]:
    """VPS, SPS, PPS, SEI and the IDR slice(s) of libx265's first access unit."""
    return nal_units(reference_stream("H265").frames[0])


def aggregation(nals: list[bytes], dons: list[int] | None = None) -> bytes:
    """An AP (RFC 7798 4.4.2, figures 7 and 8)."""
    out = bytearray(AP)
    for i, nal in enumerate(nals):
        if dons is not None:
            if i == 0:
                out += dons[0].to_bytes(2)
            else:
                out.append((dons[i] - dons[i - 1] - 1) & 0xFF)
        out += len(nal).to_bytes(2) + nal
    return bytes(out)


def fragments(nal: bytes, size: int, don: int | None = None) -> list[bytes]:
    """FUs of ``nal`` carrying ``size`` bytes each (RFC 7798 4.4.3, figure 9)."""
    header = bytes(((nal[0] & 0x81) | (49 << 1), nal[1]))
    fu_type = (nal[0] >> 1) & 0x3F
    body = nal[2:]
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    out = []
    for i, chunk in enumerate(chunks):
        fu = fu_type | (0x80 if i == 0 else 0) | (0x40 if i == len(chunks) - 1 else 0)
        donl = don.to_bytes(2) if don is not None and i == 0 else b""
        out.append(header + bytes((fu,)) + donl + chunk)
    return out


def single(nal: bytes, don: int | None = None) -> bytes:
    return nal if don is None else nal[:2] + don.to_bytes(2) + nal[2:]


def run(depacketizer: H265Depacketizer, payloads: list[bytes]) -> bytes:
    return depacketizer.assemble(b"".join(depacketizer.depacketize(p).data for p in payloads)).data


def test_the_reference_access_unit_has_what_the_crafted_packets_need() -> None:
    types = [(nal[0] >> 1) & 0x3F for nal in first_access_unit()]
    assert types[:3] == [32, 33, 34]  # VPS, SPS, PPS
    assert any(16 <= t <= 21 for t in types)


def test_single_aggregated_and_fragmented_units_rebuild_the_access_unit() -> None:
    vps, sps, pps, *rest = first_access_unit()
    payloads = [aggregation([vps, sps, pps])]
    for nal in rest:
        payloads += fragments(nal, 500) if len(nal) > 600 else [single(nal)]
    assert sum(p[:2] == FU for p in payloads) >= 3
    depacketizer = H265Depacketizer()
    annexb = run(depacketizer, payloads)
    assert nal_units(annexb) == first_access_unit()
    assert annexb.startswith(b"\x00\x00\x00\x01")
    assert decode("H265", [annexb]) == decode("H265", [reference_stream("H265").frames[0]])
    assert depacketizer.errors == {} and depacketizer.frames == 1


def test_donl_and_dond_are_stripped_and_the_units_put_in_decoding_order() -> None:
    vps, sps, pps, *rest = first_access_unit()
    # DONs across the 16-bit wrap, sent out of order: the slices first, then the
    # parameter sets (an AP with DONL + DOND), then the SEI.
    dons = {0: 65534, 1: 65535, 2: 0}
    later = {i + 3: (1 + i) & 0xFFFF for i in range(len(rest))}
    payloads: list[bytes] = []
    for i, nal in enumerate(rest[1:], start=1):
        don = later[i + 3]
        payloads += fragments(nal, 400, don) if len(nal) > 500 else [single(nal, don)]
    payloads.append(aggregation([vps, sps, pps], [dons[0], dons[1], dons[2]]))
    payloads += (
        fragments(rest[0], 400, later[3]) if len(rest[0]) > 500 else [single(rest[0], later[3])]
    )
    depacketizer = H265Depacketizer(donl=True)
    annexb = run(depacketizer, payloads)
    assert nal_units(annexb) == first_access_unit()


def test_dond_gaps_add_up() -> None:
    vps, sps, pps, *_ = first_access_unit()
    # DON 10, then DOND 4 -> 15, then DOND 0 -> 16 (RFC 7798 4.4.2: DON = prev + DOND + 1).
    ap = AP + (10).to_bytes(2) + len(pps).to_bytes(2) + pps
    ap += bytes((4,)) + len(vps).to_bytes(2) + vps + bytes((0,)) + len(sps).to_bytes(2) + sps
    # An SPS with DON 12 in its own packet sits between the PPS (10) and the VPS (15).
    sps_alone = single(sps, 12)
    depacketizer = H265Depacketizer(donl=True)
    assert nal_units(run(depacketizer, [ap, sps_alone])) == [pps, sps, vps, sps]


def test_paci_is_dropped_and_counted() -> None:
    vps, sps, pps, *_ = first_access_unit()
    paci = PACI + b"\x00\x00" + vps  # A, cType, PHSsize = 0, no PHES, then the payload
    depacketizer = H265Depacketizer()
    packet = depacketizer.depacketize(paci)
    assert packet.data == b"" and packet.begins and packet.ends
    assert depacketizer.dropped == {"paci": 1}
    assert nal_units(run(depacketizer, [single(sps), paci, single(pps)])) == [sps, pps]
    with pytest.raises(PayloadError) as caught:
        run(depacketizer, [paci])
    assert caught.value.reason == "empty_frame"


def test_per_packet_boundary_flags() -> None:
    nal = max(first_access_unit(), key=len)
    parts = fragments(nal, 300)
    depacketizer = H265Depacketizer()
    results = [depacketizer.depacketize(p) for p in parts]
    assert [(r.begins, r.ends, r.frame_start) for r in results] == (
        [(True, False, True)] + [(False, False, False)] * (len(parts) - 2) + [(False, True, False)]
    )
    assert not any(r.keyframe for r in results)  # H.265 has no payload-level key flag
    assert results[-1].ends_frame(marker=True) and not results[-1].ends_frame(marker=False)
    assert not results[0].ends_frame(marker=True)


SPS_LIKE = b"\x42\x01" + b"\x01\x02\x03"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "truncated"),
        (b"\x42", "truncated"),
        (b"\xc2\x01\x00", "forbidden_bit"),
        (b"\x42\x00\x00", "bad_nal_header"),  # TID 0
        (b"\x66\x01\x00", "reserved_type"),  # 51
        (b"\x7e\x01\x00", "reserved_type"),  # 63
        (AP, "aggregation_length"),  # no unit
        (AP + b"\x00", "aggregation_length"),  # half a size field
        (AP + b"\x00\x00", "aggregation_length"),  # size 0
        (AP + b"\x00\x10" + SPS_LIKE, "aggregation_length"),  # size past the packet
        (AP + b"\x00\x05" + SPS_LIKE + b"\x00", "aggregation_length"),  # trailing byte
        (AP + b"\x00\x03" + AP + b"\x00", "bad_nal_header"),  # an AP inside an AP
        (AP + b"\x00\x03\xc2\x01\x00", "forbidden_bit"),
        (FU, "truncated"),  # no FU header
        (FU + b"\xd3" + b"\x00", "fu_start_and_end"),
        (FU + b"\xb0" + b"\x00", "fu_bad_type"),  # FuType 48
        (FU + b"\x93", "fu_empty"),
        (FU + b"\x13", "fu_empty"),
    ],
)
def test_malformed_payloads_are_refused_with_their_reason(payload: bytes, reason: str) -> None:
    depacketizer = H265Depacketizer()
    with pytest.raises(PayloadError) as caught:
        depacketizer.depacketize(payload)
    assert caught.value.reason == reason
    assert isinstance(caught.value, ValueError)
    assert depacketizer.errors == {reason: 1} and depacketizer.packets == 0


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x42\x01\x00", "truncated"),  # single NAL without room for its DONL
        (AP + b"\x00", "aggregation_length"),  # DONL cut
        (AP + b"\x00\x01\x00\x03" + SPS_LIKE + b"\x00", "aggregation_length"),  # DOND, no size
        (FU + b"\x93\x00\x01", "fu_empty"),  # start with its DONL and no data
    ],
)
def test_malformed_payloads_with_donl(payload: bytes, reason: str) -> None:
    depacketizer = H265Depacketizer(donl=True)
    with pytest.raises(PayloadError) as caught:
        depacketizer.depacketize(payload)
    assert caught.value.reason == reason


def test_broken_fragment_chains_are_refused_at_the_frame_step() -> None:
    nal = max(first_access_unit(), key=len)
    first, *middle, last = fragments(nal, 300)
    sps = first_access_unit()[1]
    cases = {
        "frame_start_missing": [*middle, last],
        "frame_end_missing": [first, *middle],
        "fragment_without_end": [first, single(sps)],
        "fragment_without_start": [single(sps), *middle, last],
    }
    for reason, payloads in cases.items():
        depacketizer = H265Depacketizer()
        with pytest.raises(PayloadError) as caught:
            run(depacketizer, payloads)
        assert caught.value.reason == reason


def test_sprop_max_don_diff_decides_donl() -> None:
    assert not donl_from_fmtp({})
    assert not donl_from_fmtp({"sprop-max-don-diff": 0})
    assert donl_from_fmtp({"sprop-max-don-diff": "2"})
    for bad in ("x", -1, 32768):
        with pytest.raises(ValueError, match="sprop-max-don-diff"):
            donl_from_fmtp({"sprop-max-don-diff": bad})
    depacketizer = depacketizer_for("h265", {"sprop-max-don-diff": 1, "profile-id": 1})
    assert isinstance(depacketizer, H265Depacketizer) and depacketizer.donl
    hevc = depacketizer_for("HEVC", {})
    assert isinstance(hevc, H265Depacketizer) and not hevc.donl
    assert depacketizer_for("H264", {}) is None
