"""A flash and a beep captured at the same instant: the classic lip-sync probe, as aiortc
tracks, and how to find both in a recorded file.

:class:`FlashBeep` holds the capture clock both tracks share (its zero is the first
``recv()`` of either). The video track gives black frames at ``fps`` with white frames from
``mark_s`` for ``mark_len_s``; the audio track gives 20 ms frames of silence with a 1 kHz
tone over the same span. Their ``pts`` are capture times, so aiortc's senders stamp RTP and
sender reports from them. The audio track hands its first frame over ``audio_late_s``
after capture zero and then catches up at once (an encoder whose audio path buffers):
its frames arrive that much later than the video frames captured with them, while its
sender reports still tell the truth. A recording aligned by arrival hears the beep
``audio_late_s`` after the flash; one aligned by the reports, at the flash.

:func:`flash_and_beep` decodes a recorded file and returns when each shows (seconds on
the file's time line).
"""

from __future__ import annotations

import asyncio
import fractions
import time
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from aiortc import MediaStreamTrack

AUDIO_RATE = 48000
AUDIO_FRAME = 960  # 20 ms


@dataclass
class FlashBeep:
    """The shared capture clock and the marks (module doc)."""

    mark_s: float = 2.0
    mark_len_s: float = 0.2
    audio_late_s: float = 0.3
    fps: int = 30
    size: tuple[int, int] = (320, 240)
    _zero: float | None = field(default=None, init=False)

    def zero(self) -> float:
        if self._zero is None:
            self._zero = time.time()
        return self._zero

    def marked(self, capture_s: float) -> bool:
        return self.mark_s <= capture_s < self.mark_s + self.mark_len_s

    def video(self) -> MediaStreamTrack:
        return _FlashTrack(self)

    def audio(self) -> MediaStreamTrack:
        return _BeepTrack(self)


async def _until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


class _FlashTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, probe: FlashBeep) -> None:
        super().__init__()
        self._probe = probe
        self._index = 0

    async def recv(self) -> av.VideoFrame:
        probe = self._probe
        capture_s = self._index / probe.fps
        await _until(probe.zero() + capture_s)
        width, height = probe.size
        level = 235 if probe.marked(capture_s) else 16
        planes = np.full((height * 3 // 2, width), 128, dtype=np.uint8)
        planes[:height] = level
        frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
        frame.pts = self._index * (90000 // probe.fps)
        frame.time_base = fractions.Fraction(1, 90000)
        self._index += 1
        return frame


class _BeepTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, probe: FlashBeep) -> None:
        super().__init__()
        self._probe = probe
        self._index = 0

    async def recv(self) -> av.AudioFrame:
        probe = self._probe
        capture_s = self._index * AUDIO_FRAME / AUDIO_RATE
        await _until(probe.zero() + max(capture_s, probe.audio_late_s))
        samples = np.zeros(AUDIO_FRAME, dtype=np.int16)
        if probe.marked(capture_s):
            t = (self._index * AUDIO_FRAME + np.arange(AUDIO_FRAME)) / AUDIO_RATE
            samples = (np.sin(2 * np.pi * 1000 * t) * 16000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = self._index * AUDIO_FRAME
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        self._index += 1
        return frame


@dataclass(frozen=True)
class Marks:
    flash_s: float | None
    beep_s: float | None
    video_pts_monotonic: bool
    audio_pts_monotonic: bool


def flash_and_beep(path: Path) -> Marks:
    """Decode ``path``: the time of its first bright video frame and of its first loud
    audio sample, and whether each stream's packet timestamps only go forward."""
    flash_s: float | None = None
    beep_s: float | None = None
    with av.open(str(path)) as container:
        last: dict[str, int] = {}
        monotonic = {"video": True, "audio": True}
        for packet in container.demux():
            if packet.dts is None or not packet.size:
                continue
            kind = packet.stream.type
            if kind in last and packet.dts <= last[kind]:
                monotonic[kind] = False
            last[kind] = packet.dts
    with av.open(str(path)) as container:
        for picture in container.decode(video=0):
            luma = picture.to_ndarray(format="gray")
            if picture.time is not None and float(luma.mean()) > 128:
                flash_s = picture.time
                break
    with av.open(str(path)) as container:
        for sound in container.decode(audio=0):
            data = np.abs(sound.to_ndarray()).max(axis=0)
            loud = np.flatnonzero(data > 0.1 * (32768 if data.dtype == np.int16 else 1))
            if sound.time is not None and loud.size:
                beep_s = sound.time + int(loud[0]) / sound.sample_rate
                break
    return Marks(flash_s, beep_s, monotonic["video"], monotonic["audio"])
