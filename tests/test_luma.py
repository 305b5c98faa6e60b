"""pipeline._luma (C) against its references: numpy's block means and swscale's ``gray``.

``block_means`` is checked exactly against a numpy reference of the same definition
(blocks tiling the picture, rounded means, the limited-to-full range mapping), on
hypothesis-drawn sizes, strides and contents; ``small_luma`` is checked against the
swscale path it replaced on decoded pictures of every fast-path format, both ranges,
and a size that does not divide into 64x36; the two sums against numpy's. Bad sizes
and short buffers are refused before anything is written.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from av.video.frame import VideoFrame
from av.video.reformatter import VideoReformatter
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline._luma import abs_diff_sum, block_means, code_sum
from pipeline.analyzers.base import SMALL_HEIGHT, SMALL_WIDTH, _swscale_luma, small_luma


def reference(
    plane: npt.NDArray[np.uint8], out_w: int, out_h: int, limited: bool
) -> npt.NDArray[np.uint8]:
    """The module doc's definition in numpy: block [i*w//out_w, (i+1)*w//out_w) x rows."""
    height, width = plane.shape
    out = np.empty((out_h, out_w), np.uint8)
    for j in range(out_h):
        rows = plane[j * height // out_h : (j + 1) * height // out_h]
        for i in range(out_w):
            block = rows[:, i * width // out_w : (i + 1) * width // out_w]
            total, count = int(block.sum(dtype=np.int64)), block.size
            if limited:
                num, den = 255 * (total - 16 * count), 219 * count
                code = 0 if num <= 0 else (num + den // 2) // den
            else:
                code = (total + count // 2) // count
            out[j, i] = min(255, code)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.integers(4, 90),  # width
    st.integers(3, 50),  # height
    st.integers(0, 9),  # stride padding
    st.integers(1, 4),  # out width
    st.integers(1, 3),  # out height
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_block_means_is_the_rounded_mean_of_each_tile(
    width: int, height: int, pad: int, out_w: int, out_h: int, limited: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # Contents from flat to noisy: a level plus noise of a drawn amplitude.
    level, spread = int(rng.integers(0, 256)), int(rng.integers(0, 256))
    noise = rng.integers(-spread, spread + 1, (height, width + pad))
    padded = np.clip(level + noise, 0, 255).astype(np.uint8)
    out = np.full((out_h, out_w), 7, np.uint8)
    block_means(padded.tobytes(), width, height, width + pad, out, out_w, out_h, limited)
    np.testing.assert_array_equal(out, reference(padded[:, :width], out_w, out_h, limited))


def test_block_means_maps_video_black_and_white_to_the_full_range() -> None:
    for code, limited, expected in [
        (16, True, 0),
        (235, True, 255),
        (0, True, 0),
        (255, True, 255),
    ]:
        out = np.empty((2, 2), np.uint8)
        block_means(bytes([code]) * 64, 8, 8, 8, out, 2, 2, limited)
        assert out.tolist() == [[expected] * 2] * 2
    out = np.empty((1, 1), np.uint8)
    block_means(bytes([16]) * 4, 2, 2, 2, out, 1, 1, False)
    assert out.tolist() == [[16]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((bytes(64), 8, 8, 8, 2, 2), None),  # fits: the baseline of this table
        ((bytes(64), 8, 8, 8, 9, 2), "at least as large"),
        ((bytes(64), 8, 8, 8, 0, 2), "at least as large"),
        ((bytes(64), 8, 8, 7, 2, 2), "line_size"),
        ((bytes(63), 8, 8, 8, 2, 2), "plane is shorter"),
        ((bytes(64), -8, 8, 8, 2, 2), "at least as large"),
        ((bytes(64), 70000, 1, 70000, 2, 1), "65536"),
        ((bytes(64), 8, 8, 10**15, 2, 2), "line_size"),
    ],
)
def test_block_means_refuses_what_does_not_fit_and_writes_nothing(
    args: tuple[bytes, int, int, int, int, int], message: str | None
) -> None:
    plane, width, height, line_size, out_w, out_h = args
    out = bytearray(b"\x07" * 8)
    if message is None:
        block_means(plane, width, height, line_size, out, out_w, out_h, True)
        assert out[:4] == bytes(4)
        return
    with pytest.raises(ValueError, match=message):
        block_means(plane, width, height, line_size, out, out_w, out_h, True)
    assert out == bytearray(b"\x07" * 8)
    with pytest.raises(ValueError, match="out is shorter"):
        block_means(bytes(64), 8, 8, 8, bytearray(3), 2, 2, True)
    with pytest.raises(TypeError):  # a read-only out
        block_means(bytes(64), 8, 8, 8, bytes(4), 2, 2, True)


def test_the_sums_are_numpys() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (SMALL_HEIGHT, SMALL_WIDTH)).astype(np.uint8)
    b = rng.integers(0, 256, (SMALL_HEIGHT, SMALL_WIDTH)).astype(np.uint8)
    assert code_sum(a) == int(a.sum())
    assert abs_diff_sum(a, b) == int(np.abs(a.astype(np.int64) - b).sum())
    assert abs_diff_sum(a, a) == 0 and code_sum(b"") == 0
    with pytest.raises(ValueError, match="one length"):
        abs_diff_sum(a, b[:-1])


def _picture(width: int, height: int, pix_fmt: str) -> VideoFrame:
    """A sharp, moving-looking pattern (waves, an edge, a bright box) in ``pix_fmt``."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack(
        [
            128 + 100 * np.sin(x / 7.0),
            128 + 100 * np.sin(y / 5.0),
            np.where(x > width // 3, 230, 20),
        ],
        axis=2,
    )
    rgb[height // 4 : height // 2, width // 5 : width // 2] = 250
    return VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24").reformat(format=pix_fmt)


@pytest.mark.parametrize(
    ("pix_fmt", "size", "color_range", "tolerance"),
    [
        ("yuv420p", (1280, 720), 0, 3),  # what decoders give
        ("yuv420p", (1278, 718), 0, 8),  # tiles of 19 and 20 pixels
        ("yuv420p", (320, 180), 2, 3),  # tagged full range
        ("yuvj420p", (640, 360), 0, 3),
        ("nv12", (640, 360), 0, 3),
        ("yuv444p", (640, 360), 1, 3),
    ],
)
def test_small_luma_agrees_with_the_swscale_path(
    pix_fmt: str, size: tuple[int, int], color_range: int, tolerance: int
) -> None:
    frame = _picture(*size, pix_fmt)
    frame.color_range = color_range
    codes = small_luma(frame, VideoReformatter())
    expected = _swscale_luma(frame, VideoReformatter()).astype(np.int16)
    assert codes.shape == (SMALL_HEIGHT, SMALL_WIDTH) and not codes.flags.writeable
    assert codes.flags.c_contiguous  # what the C sums of scene and black read
    # ... and it is the C's block means (the fast path was taken), exactly:
    plane = frame.planes[0]
    luma = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[: size[1], : size[0]]
    limited = not pix_fmt.startswith("yuvj") and color_range != 2
    np.testing.assert_array_equal(codes, reference(luma, SMALL_WIDTH, SMALL_HEIGHT, limited))
    # swscale's area filter is rounded in fixed point: within a few codes where the tiles
    # are even. Where they are not, its filter is wider than a tile (it weighs pixels of
    # the neighbours), which on this sharp pattern moves a code by up to 7. No bias.
    assert int(np.abs(codes.astype(np.int16) - expected).max()) <= tolerance
    assert abs(float(codes.mean()) - float(expected.mean())) < 1.0


def test_small_luma_falls_back_to_swscale_for_other_formats_and_tiny_pictures() -> None:
    for frame in (_picture(640, 360, "gray"), _picture(48, 30, "yuv420p")):
        codes = small_luma(frame, VideoReformatter())
        np.testing.assert_array_equal(codes, _swscale_luma(frame, VideoReformatter()))
        assert codes.flags.c_contiguous and not codes.flags.writeable
