"""pipeline._luma (C) against its references: numpy's block means and swscale's ``gray``.

``block_means`` is checked exactly against a numpy reference of the same definition
(blocks tiling the picture, rounded means, the limited-to-full range mapping), on
hypothesis-drawn sizes, strides and contents; ``small_luma`` is checked against the
swscale path it replaced on decoded pictures of every fast-path format, both ranges,
and a size that does not divide into 64x36; the two sums against numpy's. Bad sizes
and short planes are refused before anything is read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from av.video.frame import VideoFrame
from av.video.reformatter import VideoReformatter
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline._luma import abs_diff_sum, block_means, code_sum, strips
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
    codes = block_means(padded.tobytes(), width, height, width + pad, out_w, out_h, limited)
    assert isinstance(codes, bytes) and len(codes) == out_w * out_h
    out = np.frombuffer(codes, np.uint8).reshape(out_h, out_w)
    np.testing.assert_array_equal(out, reference(padded[:, :width], out_w, out_h, limited))


@pytest.mark.parametrize(
    ("width", "height", "pad", "out_w", "out_h"),
    [
        (1280, 720, 0, 64, 36),  # what decoders give: the AVX2 strips, 32 columns each
        (1278, 718, 34, 64, 36),  # tiles of 19 and 20, a padded stride, a partial strip
        (200, 600, 8, 3, 2),  # 300 rows a tile: over 257, the 32-bit column sums
    ],
)
def test_block_means_of_full_sized_planes_is_the_reference(
    width: int, height: int, pad: int, out_w: int, out_h: int
) -> None:
    rng = np.random.default_rng(width * height)
    padded = rng.integers(0, 256, (height, width + pad)).astype(np.uint8)
    for limited in (False, True):
        codes = block_means(padded.tobytes(), width, height, width + pad, out_w, out_h, limited)
        np.testing.assert_array_equal(
            np.frombuffer(codes, np.uint8).reshape(out_h, out_w),
            reference(padded[:, :width], out_w, out_h, limited),
        )


def test_the_portable_loop_gives_the_same_codes_as_the_strips() -> None:
    """``WHIP_LUMA_PORTABLE`` (read at import) keeps the module off its AVX2 strips: the
    same plane through both, the portable one in a child interpreter."""
    rng = np.random.default_rng(7)
    plane = rng.integers(0, 256, (720, 1312)).astype(np.uint8).tobytes()
    script = (
        "import sys; from pipeline._luma import block_means, strips; "
        "assert not strips; plane = sys.stdin.buffer.read(); "
        "sys.stdout.buffer.write(block_means(plane, 1280, 720, 1312, 64, 36, True))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        input=plane,
        capture_output=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "WHIP_LUMA_PORTABLE": "1"},
    )
    assert child.stdout == block_means(plane, 1280, 720, 1312, 64, 36, True)
    assert strips == ("avx2" in Path("/proc/cpuinfo").read_text())  # this one took them


def test_block_means_maps_video_black_and_white_to_the_full_range() -> None:
    for code, limited, expected in [
        (16, True, 0),
        (235, True, 255),
        (0, True, 0),
        (255, True, 255),
    ]:
        assert block_means(bytes([code]) * 64, 8, 8, 8, 2, 2, limited) == bytes([expected] * 4)
    assert block_means(bytes([16]) * 4, 2, 2, 2, 1, 1, False) == bytes([16])


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
def test_block_means_refuses_what_does_not_fit(
    args: tuple[bytes, int, int, int, int, int], message: str | None
) -> None:
    plane, width, height, line_size, out_w, out_h = args
    if message is None:
        assert block_means(plane, width, height, line_size, out_w, out_h, True) == bytes(4)
        return
    with pytest.raises(ValueError, match=message):
        block_means(plane, width, height, line_size, out_w, out_h, True)
    with pytest.raises(TypeError):  # the plane must be a buffer
        block_means("not a buffer", 8, 8, 8, 2, 2, True)  # type: ignore[arg-type]


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
    luma = small_luma(frame, VideoReformatter())
    assert isinstance(luma, bytes) and len(luma) == SMALL_WIDTH * SMALL_HEIGHT  # immutable
    codes = np.frombuffer(luma, np.uint8).reshape(SMALL_HEIGHT, SMALL_WIDTH)
    swscaled = _swscale_luma(frame, VideoReformatter())
    expected = np.frombuffer(swscaled, np.uint8).reshape(codes.shape).astype(np.int16)
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
        assert isinstance(codes, bytes) and len(codes) == SMALL_WIDTH * SMALL_HEIGHT
        assert codes == _swscale_luma(frame, VideoReformatter())
