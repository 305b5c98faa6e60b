"""Built-in analyzers of decoded frames.

One class per module, each with ``process(frame, meta) -> list[(event_type, data)]``:

- :class:`~pipeline.analyzers.frame_stats.FrameStats` (any track): counts, fps,
  bitrate, codec/resolution changes, periodic ``stats``.
- :class:`~pipeline.analyzers.scene.SceneChange` (video): ``scene_change``.
- :class:`~pipeline.analyzers.black.VideoBlack` (video): ``video_black``.
- :class:`~pipeline.analyzers.thumbnail.Thumbnailer` (video): periodic JPEG, no events.
- :class:`~pipeline.analyzers.silence.AudioSilence` (audio): ``audio_silence``.

Threads: an analyzer instance belongs to one track and runs on that track's decode
worker thread only (numpy and FFmpeg work never touches the event loop). State that
other threads may read is documented per attribute (plain values rebound in one
assignment, or a lock). An exception from an analyzer is the worker's failure (the
supervisor reports a fault); bad *media* never raises, the decoder counts it first.
:class:`pipeline.analysis.Analysis` composes them into one ``on_frame`` callback.
"""

from __future__ import annotations

from pipeline.analyzers.base import Event, media_ms
from pipeline.analyzers.black import VideoBlack
from pipeline.analyzers.frame_stats import FrameStats
from pipeline.analyzers.scene import SceneChange
from pipeline.analyzers.silence import AudioSilence, level_dbfs
from pipeline.analyzers.thumbnail import Thumbnailer

__all__ = [
    "AudioSilence",
    "Event",
    "FrameStats",
    "SceneChange",
    "Thumbnailer",
    "VideoBlack",
    "level_dbfs",
    "media_ms",
]
