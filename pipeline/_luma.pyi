"""The block means behind :func:`pipeline.analyzers.base.small_luma`, in C (``_luma.c``).

The sums run with the GIL released; every size and both buffers are checked first.
"""

from collections.abc import Buffer

strips: int
"""1 when :func:`block_means` sums with its AVX2 strips (the CPU has AVX2 and the
environment had no ``WHIP_LUMA_PORTABLE`` at import), 0 when with the portable loop."""

def block_means(
    plane: Buffer,
    width: int,
    height: int,
    line_size: int,
    out_width: int,
    out_height: int,
    limited_range: bool,
    /,
) -> bytes:
    """The ``out_width`` x ``out_height`` means of the blocks tiling a ``width`` x
    ``height`` 8-bit luma plane (rows of ``line_size`` bytes), rounded, row by row; with
    ``limited_range``, mapped from 16..235 to 0..255 (clamped).

    Raises ValueError when the picture is smaller than the output, a side is over
    65536, ``line_size`` is under ``width`` (or over 262144), or the plane is too short.
    """

def code_sum(codes: Buffer, /) -> int:
    """The sum of the bytes of ``codes``."""

def abs_diff_sum(a: Buffer, b: Buffer, /) -> int:
    """The sum of ``|a[i] - b[i]|`` over the bytes of two buffers of one length (ValueError
    when the lengths differ)."""
