"""What the analyzers share: the event pair, media time, small luma, episodes.

Every analyzer runs on the decode worker thread of its track (module doc of
:mod:`pipeline.analyzers`), so nothing here locks.
"""

from __future__ import annotations

import av
import numpy as np
from av.video.plane import VideoPlane
from av.video.reformatter import VideoReformatter

from pipeline._luma import block_means
from pipeline.decoder import FrameMeta

Event = tuple[str, dict[str, object]]
"""``(event_type, data)``: one timeline event an analyzer asks to emit."""

VIDEO_CLOCK_HZ = 90000
AUDIO_CLOCK_HZ = {"OPUS": 48000}
"""RTP clock rates by codec (upper-cased aiortc name). Every other audio codec aiortc
receives runs an 8 kHz clock (PCMU, PCMA, and G722, whose RTP clock is 8 kHz even though
it samples at 16 kHz: RFC 3551 section 4.5.2)."""
DEFAULT_AUDIO_CLOCK_HZ = 8000

SMALL_WIDTH, SMALL_HEIGHT = 64, 36
"""The downscaled luma picture the scene and black analyzers look at (16:9, 2304 px)."""


def media_ms(meta: FrameMeta) -> float:
    """The frame's media time in milliseconds since the track's first frame.

    From the RTP timestamp (aiortc unwraps it and starts it at 0), so it is the sender's
    clock: gaps from dropped frames are kept, decode speed does not matter.
    """
    if meta.kind == "video":
        clock = VIDEO_CLOCK_HZ
    else:
        clock = AUDIO_CLOCK_HZ.get(meta.codec.upper(), DEFAULT_AUDIO_CLOCK_HZ)
    return meta.timestamp * 1000.0 / clock


LUMA_MAX = 255
"""Full-range 8-bit luma: a :func:`small_luma` code ``c`` is the luma ``c / 255``."""

_LUMA_PLANE_FORMATS = {
    "yuv420p": False,
    "yuv422p": False,
    "yuv444p": False,
    "yuv440p": False,
    "nv12": False,
    "nv21": False,
    "yuvj420p": True,
    "yuvj422p": True,
    "yuvj444p": True,
    "yuvj440p": True,
}
"""Pixel formats whose first plane is 8-bit luma at the picture's size -> whether that
luma is full range by the format itself (the ``yuvj`` ones). What decoders give us is
nearly always ``yuv420p``; every other format goes through swscale."""

_FULL_RANGE = 2
"""``AVCOL_RANGE_JPEG``: a frame tagged full range (whatever its format)."""


def small_luma(frame: av.VideoFrame, reformatter: VideoReformatter) -> bytes:
    """The frame's luma, area-averaged down to 64x36: full-range 8-bit codes, 0..255
    (``code / LUMA_MAX`` is the luma on 0..1), row by row, as one ``bytes`` of
    ``SMALL_WIDTH * SMALL_HEIGHT`` (immutable: scene and black share it).

    Computed once per frame, by whoever runs both analyzers that need it
    (:class:`~pipeline.analysis.Analysis` hands the same codes to scene and black): the
    downscale is most of their cost. No cache here: a thread-local one cost 2-3 us a
    frame on a worker whose caches the decoder just went through, and kept the last
    decoded picture (a decoder buffer) alive until the next.

    Each output code is the mean of the source luma codes of one block, the blocks
    tiling the picture (every row and every column is read: sampling some rows would
    make vertical motion alias: reading every other row halves this read's cost, about
    25 us of a 720p frame, but fine stripes that start scrolling then score 1.0, a false
    cut; ``test_scene_change_stays_quiet_when_fine_stripes_start_scrolling``).
    Limited-range luma is mapped to full range, so video black (Y=16) reads 0 and white
    (Y=235) 255, as swscale's ``gray`` output maps it.

    Two ways, one result (within a few codes: swscale rounds its filter in fixed point,
    and where the picture does not divide into 64x36 its filter is wider than a tile):
    for the formats whose first plane is 8-bit luma (``yuv420p`` and kin, what decoders
    give) :func:`pipeline._luma.block_means` sums that plane in C with the GIL released,
    reading nothing else; for every other format (10-bit, ``gray``, RGB) and a picture
    smaller than 64x36, swscale's ``AREA`` filter makes a ``gray`` picture
    (``threads=1``: a thread pool per tiny picture would cost more). Either way the luma
    plane is read once, mostly from memory (the decoder wrote it a frame's decode ago),
    which is what this costs; the C reads it with less work per byte and fetches rows
    ahead (figures: ``docs/PERFORMANCE.md``, "Analyzers").

    The fast path's Python is kept to a few attribute reads, because every object it
    touches is cold after a decode: the plane is made alone (``VideoPlane(frame, 0)``;
    ``frame.planes`` makes one per plane, 3 for ``yuv420p``) and the C returns the codes
    as ``bytes`` (no numpy array to allocate and flag read-only).
    """
    width, height = frame.width, frame.height
    full = _LUMA_PLANE_FORMATS.get(frame.format.name)
    if full is not None and width >= SMALL_WIDTH and height >= SMALL_HEIGHT:
        limited = not full and frame.color_range != _FULL_RANGE
        plane = VideoPlane(frame, 0)
        return block_means(
            plane, width, height, plane.line_size, SMALL_WIDTH, SMALL_HEIGHT, limited
        )
    return _swscale_luma(frame, reformatter)


def _swscale_luma(frame: av.VideoFrame, reformatter: VideoReformatter) -> bytes:
    """:func:`small_luma` by swscale (any format): the output frame's plane, without the
    padding FFmpeg may add at the end of each line."""
    small = reformatter.reformat(
        frame,
        width=SMALL_WIDTH,
        height=SMALL_HEIGHT,
        format="gray",
        interpolation="AREA",
        threads=1,
    )
    plane = small.planes[0]
    stride = plane.line_size  # FFmpeg pads lines to its alignment (64 here, no padding)
    codes = np.frombuffer(plane, np.uint8, SMALL_HEIGHT * stride).reshape(SMALL_HEIGHT, stride)
    return codes[:, :SMALL_WIDTH].tobytes()


class Episode:
    """A condition that must hold for ``min_duration_ms`` of media time to count.

    The black and silence analyzers feed it one ``(active, at_ms)`` per frame. It opens
    an episode (``start``) once the condition has held for the minimum duration, dated
    from the first frame it held on, and closes it (``end``) at the first frame it does
    not hold on. Time running backwards (a new sender clock) restarts a pending run.
    """

    __slots__ = ("_last_ms", "_since_ms", "min_duration_ms", "started")

    def __init__(self, min_duration_ms: float) -> None:
        if min_duration_ms < 0:
            raise ValueError("min_duration_ms must not be negative")
        self.min_duration_ms = min_duration_ms
        self.started = False
        self._since_ms: float | None = None
        self._last_ms: float | None = None

    @property
    def idle(self) -> bool:
        """Nothing pending and nothing open: an inactive frame would change nothing (so
        :meth:`update` may be skipped for it, which the black analyzer does per frame)."""
        return self._since_ms is None

    def update(self, active: bool, at_ms: float, until_ms: float) -> dict[str, object] | None:
        """One frame covering ``[at_ms, until_ms)``; the event data when a state changes.

        ``start``: ``{"state": "start", "at_ms"}``; ``end``: ``{"state": "end",
        "at_ms", "duration_ms"}`` where ``at_ms`` is when the condition stopped holding.
        """
        if self._since_ms is not None and at_ms < self._since_ms:
            self._since_ms = None
            self.started = False
        if active:
            if self._since_ms is None:
                self._since_ms = at_ms
            self._last_ms = until_ms
            if not self.started and until_ms - self._since_ms >= self.min_duration_ms:
                self.started = True
                return {"state": "start", "at_ms": round(self._since_ms)}
            return None
        if self.started:
            return self._finish(at_ms)
        self._reset()
        return None

    def close(self) -> dict[str, object] | None:
        """End an open episode at the last frame seen (the stream ended); else None."""
        if not self.started or self._last_ms is None:
            self._reset()
            return None
        data = self._finish(self._last_ms)
        if data is not None:
            data["reason"] = "stream_end"
        return data

    def _finish(self, at_ms: float) -> dict[str, object] | None:
        since = self._since_ms
        self._reset()
        if since is None:
            return None
        return {"state": "end", "at_ms": round(at_ms), "duration_ms": round(at_ms - since)}

    def _reset(self) -> None:
        self._since_ms = None
        self.started = False
