"""A camera picture that needs bitrate: an MJPEG loop for Chromium's file-backed fake camera.

Chromium's built-in fake camera draws a flat, nearly still pattern that VP8 codes at about
700 kb/s at 720p whatever the estimate allows, so it cannot show whether a publisher's
bitrate ramped. :func:`write_busy_mjpeg` writes a loop that does need it: coarse random
blocks scrolling sideways, with light per-frame grain (about 2 Mb/s of VP8 at 720p30 at a
reasonable quality), for ``--use-file-for-fake-video-capture`` (Chromium plays an
``.mjpeg`` file at 30 fps and loops it).

Pure data: the same arguments write the same bytes (a seeded generator). Used by
``bench/ramp.py`` and ``tests/test_rtc_congestion.py``.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

BLOCK = 8
"""Side of the random blocks, in pixels."""
SCROLL = 12
"""Pixels the picture moves per frame."""
MEDIUM: dict[str, int] = {"block": 40, "scroll": 3, "grain": 1}
"""A calmer loop (:func:`write_busy_mjpeg` keywords): Chromium codes it at about 1.7 Mb/s
at 640x360 and 30 fps with a mean VP8 QP near 23, so the bitrate it sends shows its
estimate, while its quality scaler is not pushed down (``bench/ramp.py --camera medium``)."""


def write_busy_mjpeg(
    path: Path,
    width: int = 1280,
    height: int = 720,
    frames: int = 60,
    grain: int = 6,
    block: int = BLOCK,
    scroll: int = SCROLL,
) -> Path:
    """Write ``frames`` frames of ``width`` x ``height`` (multiples of ``block``) to
    ``path`` as raw MJPEG; returns ``path``. About 75 KB a frame at 720p with the defaults."""
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (height // block, 2 * width // block), dtype=np.uint8)
    picture = np.kron(blocks, np.ones((block, block), dtype=np.uint8)).astype(np.int16)
    with av.open(str(path), "w", format="mjpeg") as out:
        stream = out.add_stream("mjpeg", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuvj420p"
        stream.options = {"q": "3"}
        for i in range(frames):
            left = (i * scroll) % width
            noise = rng.integers(-grain, grain + 1, (height, width), dtype=np.int16)
            luma = np.clip(picture[:, left : left + width] + noise, 0, 255).astype(np.uint8)
            rgb = np.stack([luma, luma // 2, 255 - luma], -1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
