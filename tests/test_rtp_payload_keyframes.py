"""Bitstream keyframe detection for H.265, AV1 and VP9 (:mod:`pipeline.keyframes`) on real
encoder output and on crafted units for the rules' edge cases; and the import rule of the
media package (no aiortc, aioice or whip under ``pipeline/``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.support.rtp_reference import reference_stream
from pipeline.av1_obu import iter_obus, leb128
from pipeline.keyframes import (
    av1_is_keyframe,
    h265_is_keyframe,
    h265_nal_types,
    is_keyframe,
    vp9_is_keyframe,
)

ROOT = Path(__file__).resolve().parent.parent


def nal(nal_type: int, body: bytes = b"\xaf\x01") -> bytes:
    return b"\x00\x00\x00\x01" + bytes((nal_type << 1, 0x01)) + body


def test_h265_parameter_sets_alone_are_not_a_keyframe() -> None:
    idr = reference_stream("H265").frames[0]
    types = h265_nal_types(idr)
    assert types[:3] == [32, 33, 34]
    first_vcl = min(i for i, t in enumerate(types) if t < 32)
    # Cut the access unit before its first VCL NAL unit: VPS, SPS, PPS (and SEI) only.
    cut = idr
    for _ in range(len(types) - first_vcl):
        cut = cut[: cut.rindex(b"\x00\x00\x01")]
    assert h265_nal_types(cut) == types[:first_vcl]
    assert not h265_is_keyframe(cut)
    assert h265_is_keyframe(idr)


@pytest.mark.parametrize(
    ("nal_type", "key"),
    [(t, True) for t in range(16, 22)] + [(t, False) for t in (1, 15, 22, 23, 32, 39)],
)
def test_h265_irap_types_and_only_those(nal_type: int, key: bool) -> None:
    assert h265_is_keyframe(nal(32) + nal(nal_type)) is key
    assert is_keyframe("H265", nal(nal_type)) is key
    assert is_keyframe("hevc", nal(nal_type)) is key


def test_h265_open_gop_cra_pictures_count() -> None:
    stream = reference_stream("H265")
    keys = [i for i, f in enumerate(stream.frames) if h265_is_keyframe(f)]
    assert keys == [i for i, key in enumerate(stream.keyframes) if key]
    later_types = {t for i in keys[1:] for t in h265_nal_types(stream.frames[i])}
    assert later_types & set(range(16, 22))
    # The forbidden bit makes it not a NAL unit at all.
    assert not h265_is_keyframe(b"\x00\x00\x01" + bytes((0x80 | 19 << 1, 1)))


def obu(kind: int, payload: bytes) -> bytes:
    return bytes((kind << 3 | 0x02,)) + leb128(len(payload)) + payload


TD = obu(2, b"")
SEQUENCE = obu(1, b"\x00\x00\x00")  # seq_profile 0, not still, not reduced
REDUCED = obu(1, b"\x18")  # still_picture and reduced_still_picture_header
KEY_SHOWN = 0x10  # show_existing_frame 0, frame_type 0 (KEY_FRAME), show_frame 1


@pytest.mark.parametrize(
    ("unit", "key"),
    [
        (TD + SEQUENCE + obu(6, bytes((KEY_SHOWN,)) + b"\x00"), True),
        (TD + SEQUENCE + obu(3, bytes((KEY_SHOWN,))), True),  # a frame header OBU
        (TD + obu(6, bytes((KEY_SHOWN,))), False),  # no sequence header
        (TD + obu(6, bytes((KEY_SHOWN,))) + SEQUENCE, False),  # it comes too late
        (TD + SEQUENCE + obu(6, b"\x00"), False),  # KEY_FRAME not shown
        (TD + SEQUENCE + obu(6, bytes((0x30,))), False),  # INTER_FRAME (1), shown
        (TD + SEQUENCE + obu(3, b"\x80"), False),  # show_existing_frame
        (TD + REDUCED + obu(6, b"\x00"), True),  # reduced still picture: key by definition
        (TD + SEQUENCE + obu(6, b""), False),
        (TD + SEQUENCE + b"\x32\x05\x01", False),  # obu_size past the data
        (TD + b"\xb2\x00" + SEQUENCE + obu(6, bytes((KEY_SHOWN,))), False),  # forbidden bit
        (b"", False),
    ],
)
def test_av1_keyframe_rules(unit: bytes, key: bool) -> None:
    assert av1_is_keyframe(unit) is key
    assert is_keyframe("AV1", unit) is key


def test_av1_show_existing_frame_units_from_the_encoder_are_not_keyframes() -> None:
    stream = reference_stream("AV1")
    shown_existing = [
        f for f in stream.frames if [k for k, _ in iter_obus(f)] == [2, 3] and len(f) < 8
    ]
    assert shown_existing
    assert not any(av1_is_keyframe(f) for f in shown_existing)


def test_vp9_keyframe_rules() -> None:
    stream = reference_stream("VP9")
    key, inter = stream.frames[0], stream.frames[1]
    assert vp9_is_keyframe(key) and not vp9_is_keyframe(inter)
    assert key[1:4] == b"\x49\x83\x42"  # profile 0: the sync code right after 8 bits
    assert not vp9_is_keyframe(key[:1] + b"\x49\x83\x43" + key[4:])  # sync code
    assert not vp9_is_keyframe(bytes((key[0] & 0x3F,)) + key[1:])  # frame_marker 0
    assert not vp9_is_keyframe(bytes((key[0] | 0x08,)) + key[1:])  # show_existing_frame
    assert not vp9_is_keyframe(key[:4])
    # Profile 3: a reserved zero bit shifts the rest by one.
    sync = format(0x498342, "024b")
    profile3 = "10" + "11" + "0" + "0" + "0" + "1" + "0" + sync
    assert vp9_is_keyframe(bits(profile3))
    reserved = "10" + "11" + "1" + "0" + "0" + "1" + "0" + sync
    assert not vp9_is_keyframe(bits(reserved))


def bits(text: str) -> bytes:
    """A bit string, zero-padded to whole bytes."""
    text += "0" * (-len(text) % 8)
    return int(text, 2).to_bytes(len(text) // 8)


FORBIDDEN = ("aiortc", "aioice", "pylibsrtp", "whip")


@pytest.mark.parametrize(
    "path", sorted((ROOT / "pipeline").rglob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_pipeline_imports_no_webrtc_stack_and_no_whip(path: Path) -> None:
    imported: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.append(node.module)
    assert [name for name in imported if name.split(".")[0] in FORBIDDEN] == []
