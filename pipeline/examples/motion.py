"""Example frame processor: ``motion`` events when a picture starts or stops moving.

Enable it with::

    [pipeline]
    processors = ["pipeline.examples.motion:MotionDetector"]

Every ``every`` video frames (default 15: twice a second at 30 fps) it compares the
frame's 32x18 luma with the one it sampled last; the motion score is their mean absolute
difference on 0..1. Motion *starts* when the score reaches ``start`` (default 0.02) and
*stops* when it falls below ``stop`` (default 0.01); only those two moments become
events, so a static camera or a busy one costs the timeline nothing:

- ``("motion", {"state": "start", "score": 0.031, "at_ms": 12000})``
- ``("motion", {"state": "stop", "score": 0.004, "at_ms": 15500, "duration_ms": 3500})``

It shows the plug-in contract (:mod:`pipeline.processor`): a class made with no
arguments (one instance per session), ``kinds`` to receive video frames only, numpy
work in ``process`` (it runs on the decode worker thread), and plain JSON data.
"""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt
from av.video.reformatter import VideoReformatter

from pipeline.analyzers.base import media_ms
from pipeline.decoder import FrameMeta


class MotionDetector:
    """Motion start/stop events for a video track (module doc)."""

    kinds = ("video",)

    def __init__(self, every: int = 15, start: float = 0.02, stop: float = 0.01) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        if not 0 <= stop <= start <= 1:
            raise ValueError("need 0 <= stop <= start <= 1")
        self.every = every
        self.start = start
        self.stop = stop
        self.score = 0.0
        self.moving = False
        self._frames = 0
        self._since_ms = 0.0
        self._previous: npt.NDArray[np.float32] | None = None
        self._reformatter = VideoReformatter()

    def process(
        self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta
    ) -> list[tuple[str, dict[str, object]]]:
        if not isinstance(frame, av.VideoFrame):
            return []
        self._frames += 1
        if (self._frames - 1) % self.every:
            return []
        small = self._reformatter.reformat(
            frame, width=32, height=18, format="gray", interpolation="AREA", threads=1
        )
        luma = small.to_ndarray().astype(np.float32) / np.float32(255.0)
        previous, self._previous = self._previous, luma
        if previous is None:
            return []
        self.score = score = float(np.mean(np.abs(luma - previous)))
        at = media_ms(meta)
        if not self.moving and score >= self.start:
            self.moving, self._since_ms = True, at
            return [("motion", {"state": "start", "score": round(score, 4), "at_ms": round(at)})]
        if self.moving and score < self.stop:
            self.moving = False
            data: dict[str, object] = {
                "state": "stop",
                "score": round(score, 4),
                "at_ms": round(at),
                "duration_ms": round(at - self._since_ms),
            }
            return [("motion", data)]
        return []
