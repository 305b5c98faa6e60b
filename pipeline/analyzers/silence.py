"""Audio silence detection on decoded audio: ``audio_silence`` events.

Runs on the audio decode worker thread. Each frame's level is its RMS over every sample
of every channel, in dBFS (a full-scale square wave reads 0 dBFS, a full-scale sine
about -3 dBFS; digital silence reads ``MIN_DBFS``, -120, so the value stays a JSON
number). Planar and packed layouts, float and integer sample formats are all handled
(Opus decodes to planar float, G.711 to packed s16).

A frame is silent below ``threshold_dbfs`` (default -60). A silence episode starts once
frames have been silent for ``min_duration_s`` of media time and ends at the first frame
that is not; inside an episode a frame must reach ``threshold_dbfs + hysteresis_db`` to
end it. Events (``at_ms``: media time, :func:`~pipeline.analyzers.base.media_ms`):
``{"state": "start", "at_ms", "level_dbfs"}`` dated from the first silent frame, then
``{"state": "end", "at_ms", "duration_ms"}``. :meth:`AudioSilence.close` ends an
episode still open when the stream ends (``"reason": "stream_end"``).
"""

from __future__ import annotations

import math

import av
import numpy as np
import numpy.typing as npt

from pipeline.analyzers.base import Episode, Event, media_ms
from pipeline.decoder import FrameMeta

MIN_DBFS = -120.0

_FULL_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0, "s64": 9223372036854775808.0}
"""Integer sample formats (planar or not) -> full-scale magnitude; floats are 1.0."""


def level_dbfs(frame: av.AudioFrame) -> float:
    """RMS level of ``frame`` in dBFS, floored at ``MIN_DBFS`` (module doc)."""
    samples: npt.NDArray[np.generic] = frame.to_ndarray()
    if samples.size == 0:
        return MIN_DBFS
    name = frame.format.name.removesuffix("p")
    values = samples.astype(np.float64)
    if name == "u8":
        values -= 128.0
    mean_square = float(np.mean(np.square(values)))
    scale = _FULL_SCALE.get(name, 1.0)
    rms = math.sqrt(mean_square) / scale
    if not rms > 0.0:
        return MIN_DBFS
    return max(MIN_DBFS, 20.0 * math.log10(rms))


class AudioSilence:
    """Silence detector for one audio track (module doc)."""

    def __init__(
        self,
        threshold_dbfs: float = -60.0,
        min_duration_s: float = 2.0,
        hysteresis_db: float = 3.0,
    ) -> None:
        if threshold_dbfs > 0:
            raise ValueError("threshold_dbfs must not be above 0 dBFS")
        self.threshold_dbfs = threshold_dbfs
        self.hysteresis_db = hysteresis_db
        self.level_dbfs = MIN_DBFS
        """The last frame's level (a plain float rebound per frame: safe to read from any
        thread)."""
        self.events = 0
        self._episode = Episode(min_duration_s * 1000)

    @property
    def silent(self) -> bool:
        """A silence episode is open."""
        return self._episode.started

    def process(self, frame: av.AudioFrame, meta: FrameMeta) -> list[Event]:
        """Measure ``frame``; an ``audio_silence`` start or end event when one is due."""
        level = level_dbfs(frame)
        self.level_dbfs = level
        limit = self.threshold_dbfs + (self.hysteresis_db if self._episode.started else 0.0)
        at = media_ms(meta)
        until = at + (frame.samples * 1000.0 / frame.sample_rate if frame.sample_rate else 0.0)
        data = self._episode.update(level < limit, at, until)
        if data is None:
            return []
        if data["state"] == "start":
            data["level_dbfs"] = round(level, 1)
        self.events += 1
        return [("audio_silence", data)]

    def close(self) -> list[Event]:
        """The ``end`` event of an episode still open (call once the worker is done)."""
        data = self._episode.close()
        if data is None:
            return []
        self.events += 1
        return [("audio_silence", data)]
