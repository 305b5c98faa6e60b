"""Scene-cut detection on decoded video: ``scene_change`` events.

Runs on the video decode worker thread. Each frame is reduced to a 64x36 luma picture
(:func:`~pipeline.analyzers.base.small_luma`); ``mad`` is the mean absolute difference
from the previous frame's, on 0..1. The score follows FFmpeg's ``scdet`` filter:
``min(mad, |mad - previous mad|)``, which stays low in sustained motion (a pan or a
moving pattern makes every frame differ by about as much as the last) and spikes on a
cut (one frame differs by far more than the one before). It is scaled by
``SCORE_SCALE`` = 4 and clipped to 1, so the default threshold 0.4 is ``scdet``'s
default (10 on its 0..100 scale: 10 % of the luma range, averaged over the picture).

An event is emitted when the score reaches ``threshold`` and at least ``min_gap_s`` of
media time passed since the last one: a flash or a burst of cuts yields one event, not
a run of them. Data: ``{"score", "mad", "at_ms"}`` (``at_ms``: media time,
:func:`~pipeline.analyzers.base.media_ms`).
"""

from __future__ import annotations

import av
from av.video.reformatter import VideoReformatter

from pipeline._luma import abs_diff_sum
from pipeline.analyzers.base import LUMA_MAX, Event, media_ms, small_luma
from pipeline.decoder import FrameMeta

SCORE_SCALE = 4.0


class SceneChange:
    """Scene-cut detector for one video track (module doc)."""

    def __init__(self, threshold: float = 0.4, min_gap_s: float = 1.0) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be within 0..1")
        if min_gap_s < 0:
            raise ValueError("min_gap_s must not be negative")
        self.threshold = threshold
        self.min_gap_s = min_gap_s
        self.score = 0.0
        """The last frame's score (0 for the first frame)."""
        self.events = 0
        self._reformatter = VideoReformatter()
        self._previous: bytes | None = None
        self._previous_mad = 0.0
        self._last_event_ms: float | None = None

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[Event]:
        """Score ``frame`` against the previous one; a ``scene_change`` event when due."""
        return self.process_luma(small_luma(frame, self._reformatter), meta)

    def process_luma(self, codes: bytes, meta: FrameMeta) -> list[Event]:
        """:meth:`process` for a frame whose :func:`~pipeline.analyzers.base.small_luma`
        the caller already has (it runs black on the same codes)."""
        previous, self._previous = self._previous, codes
        if previous is None:
            return []
        # In integers (exact), scaled once, in one C loop: numpy's subtract, abs and sum
        # cost microseconds each on a worker whose caches the decoder just went through.
        mad = abs_diff_sum(codes, previous) / (len(codes) * LUMA_MAX)
        score = min(1.0, SCORE_SCALE * min(mad, abs(mad - self._previous_mad)))
        self._previous_mad = mad
        self.score = score
        if score < self.threshold or score == 0.0:
            return []
        at = media_ms(meta)
        last = self._last_event_ms
        if last is not None and last <= at < last + self.min_gap_s * 1000:
            return []
        self._last_event_ms = at
        self.events += 1
        data: dict[str, object] = {"score": round(score, 3), "mad": round(mad, 4)}
        data["at_ms"] = round(at)
        return [("scene_change", data)]
