"""Black-picture detection on decoded video: ``video_black`` events.

Runs on the video decode worker thread. A frame is black when the mean of its luma
(64x36, full range 0..1: :func:`~pipeline.analyzers.base.small_luma`) is below
``threshold`` (default 0.1; video black Y=16 reads 0.0). A black episode starts once
frames have been black for ``min_duration_s`` of media time and ends at the first frame
that is not; inside an episode a frame must reach ``threshold + hysteresis`` to end it,
so a picture hovering at the threshold does not flap.

Events (``at_ms``: media time, :func:`~pipeline.analyzers.base.media_ms`):
``{"state": "start", "at_ms", "luma"}`` dated from the first black frame, then
``{"state": "end", "at_ms", "duration_ms"}``. :meth:`VideoBlack.close` ends an episode
still open when the stream ends (``"reason": "stream_end"``).
"""

from __future__ import annotations

import av
from av.video.reformatter import VideoReformatter

from pipeline._luma import code_sum
from pipeline.analyzers.base import LUMA_MAX, Episode, Event, media_ms, small_luma
from pipeline.decoder import FrameMeta


class VideoBlack:
    """Black-picture detector for one video track (module doc)."""

    def __init__(
        self, threshold: float = 0.1, min_duration_s: float = 2.0, hysteresis: float = 0.02
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be within 0..1")
        self.threshold = threshold
        self.hysteresis = hysteresis
        self.luma = 1.0
        """Mean luma of the last frame (0..1)."""
        self.events = 0
        self._episode = Episode(min_duration_s * 1000)
        self._reformatter = VideoReformatter()

    @property
    def black(self) -> bool:
        """A black episode is open."""
        return self._episode.started

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[Event]:
        """Measure ``frame``; a ``video_black`` start or end event when one is due."""
        return self.process_luma(small_luma(frame, self._reformatter), meta)

    def process_luma(self, codes: bytes, meta: FrameMeta) -> list[Event]:
        """:meth:`process` for a frame whose :func:`~pipeline.analyzers.base.small_luma`
        the caller already has (it runs scene on the same codes)."""
        luma = code_sum(codes) / (len(codes) * LUMA_MAX)  # the mean, on 0..1
        self.luma = luma
        episode = self._episode
        if luma >= self.threshold and episode.idle:
            # Not black, and no black run pending or open: nothing to date or to end. Most
            # frames of a stream; skipping the media time and the update saves about 2-3 us
            # a frame on a worker whose caches the decoder just went through.
            return []
        limit = self.threshold + (self.hysteresis if episode.started else 0.0)
        at = media_ms(meta)
        data = episode.update(luma < limit, at, at)
        if data is None:
            return []
        if data["state"] == "start":
            data["luma"] = round(luma, 4)
        self.events += 1
        return [("video_black", data)]

    def close(self) -> list[Event]:
        """The ``end`` event of an episode still open (call once the worker is done)."""
        data = self._episode.close()
        if data is None:
            return []
        self.events += 1
        return [("video_black", data)]
