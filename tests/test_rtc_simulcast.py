"""whip.rtc.simulcast's pure parts: the VP8 keyframe size read from RTP payloads that
aiortc's own VP8 encoder makes, and the ranking rule of the hysteresis."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest
from aiortc.codecs.vpx import Vp8Encoder
from hypothesis import given
from hypothesis import strategies as st

from whip.rtc.layer_size import vp8_keyframe_size
from whip.rtc.simulcast import BITRATE_MARGIN, Layer, _clearly_above


def _vp8_payloads(width: int, height: int, frames: int) -> list[list[bytes]]:
    encoder = Vp8Encoder()
    out = []
    for index in range(frames):
        image = np.full((height, width, 3), index * 9 % 256, dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index * 3000
        frame.time_base = fractions.Fraction(1, 90_000)
        payloads, _ = encoder.encode(frame, force_keyframe=index == 0)
        out.append(payloads)
    return out


@pytest.mark.parametrize(("width", "height"), [(320, 180), (640, 360), (1280, 720)])
def test_the_size_is_read_from_the_first_packet_of_a_keyframe_only(width: int, height: int) -> None:
    frames = _vp8_payloads(width, height, 3)
    assert vp8_keyframe_size(frames[0][0]) == (width, height)
    later = [p for payloads in frames[1:] for p in payloads] + frames[0][1:]
    assert [vp8_keyframe_size(p) for p in later] == [None] * len(later)


@given(st.binary(max_size=40))
def test_any_payload_is_a_size_or_none_never_an_error(payload: bytes) -> None:
    size = vp8_keyframe_size(payload)
    assert size is None or (0 < size[0] < 1 << 14 and 0 < size[1] < 1 << 14)


def _layer(rid: str, size: tuple[int, int] | None, bitrate: int) -> Layer:
    layer = Layer(rid, paused_at_start=False)
    if size is not None:
        layer.width, layer.height = size
    layer.bitrate_bps = bitrate
    return layer


def test_a_larger_picture_ranks_above_whatever_the_bitrate() -> None:
    assert _clearly_above(_layer("f", (1280, 720), 100), _layer("h", (640, 360), 10**6))
    assert not _clearly_above(_layer("h", (640, 360), 10**6), _layer("f", (1280, 720), 100))


def test_equal_or_unknown_sizes_rank_by_bitrate_past_the_margin_only() -> None:
    low = _layer("0", None, 1_000_000)
    assert not _clearly_above(_layer("1", None, int(1_000_000 * BITRATE_MARGIN)), low)
    assert _clearly_above(_layer("1", None, int(1_000_000 * BITRATE_MARGIN) + 1), low)
