"""Recovery of a segment a crash left unfinished: cut it to what is whole, then count it.

Rules:

- Which files: the caller's (:func:`whip.recordings.recover_recordings`): a segment file
  on disk with no ``recording_segment`` event in its run's timeline was being written
  when the previous process died.
- A fragmented MP4 is truncated to its last complete fragment
  (:func:`pipeline.recording.fmp4.complete_length`); a file with not even a whole header
  (nothing playable) is deleted. Matroska is left as it is (its demuxer stops at a cut
  cluster by itself).
- The file is then opened with PyAV and its packets counted: ``video_frames``,
  ``audio_frames`` and ``duration_ms`` (the last packet's end, the container's time
  base) are what the file really holds, not what the dead process had counted.
- Blocking (file I/O and a demux): run it off the event loop.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import av

from pipeline.recording.fmp4 import complete_length

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveredSegment:
    name: str
    bytes: int
    duration_ms: int
    video_frames: int
    audio_frames: int
    truncated_bytes: int
    """Bytes cut off the end (a half-written fragment)."""


def recover_segment(path: Path) -> RecoveredSegment | None:
    """Close ``path`` as it is (module doc); None when nothing in it was playable (the
    file is deleted then)."""
    size = path.stat().st_size
    keep = size
    if path.suffix == ".mp4":
        keep = complete_length(path.read_bytes())
        if keep == 0:
            logger.warning("recovery: %s holds no whole header; deleted", path)
            path.unlink()
            return None
        if keep < size:
            os.truncate(path, keep)
    video = audio = 0
    end_s = 0.0
    try:
        with av.open(str(path)) as container:
            for packet in container.demux():
                if packet.size == 0 or packet.pts is None or packet.time_base is None:
                    continue
                if packet.stream.type == "video":
                    video += 1
                elif packet.stream.type == "audio":
                    audio += 1
                end_s = max(end_s, float((packet.pts + (packet.duration or 0)) * packet.time_base))
    except av.FFmpegError as exc:
        logger.warning("recovery: %s does not open (%s); deleted", path, exc)
        path.unlink()
        return None
    logger.info(
        "recovery: %s closed at %d bytes (%d cut), %d video and %d audio frames",
        path,
        keep,
        size - keep,
        video,
        audio,
    )
    return RecoveredSegment(path.name, keep, round(end_s * 1000), video, audio, size - keep)
