"""Periodic JPEG thumbnails of decoded video, in memory and on disk.

Runs on the video decode worker thread: the first decoded frame is encoded at once,
then one frame every ``interval_s`` of decode time (0: never). Encoding is FFmpeg's
``mjpeg`` encoder at a fixed quantizer (``quality``, 2 best .. 31 worst; FFmpeg's
``-q:v``), ``yuvj420p``, at the frame's size capped to ``max_width`` (aspect kept, even
dimensions); what one costs is in ``docs/PERFORMANCE.md`` ("Analyzers").

The latest JPEG is kept in memory (:meth:`Thumbnailer.latest`, any thread) and, with a
``directory``, written to ``<directory>/<name>.jpg`` by a temporary file in the same
directory and ``os.replace``: a reader sees the old file or the new one, never a part.

No fsync: a thumbnail is a disposable preview, replaced every few seconds and rebuilt
from the next frame, and nothing durable refers to its content. A power cut may leave
the previous picture or (on file systems that reorder data after rename) an empty file;
either is harmless for a preview of a run that the crash interrupted anyway, while an
fsync per thumbnail would stall this decode thread on disk latency for nothing.

A failed write (disk full, permissions) is logged and counted (``write_errors``), never
raised: the in-memory copy still serves, and a preview is no reason to fault ingest. A
failed *encode* raises (a bug, or FFmpeg refusing the picture): the worker's failure.
No timeline event: a thumbnail every few seconds would drown the run's timeline.
"""

from __future__ import annotations

import contextlib
import fractions
import logging
import os
import re
import tempfile
import threading
from pathlib import Path

import av
from av.video.reformatter import VideoReformatter

from pipeline.analyzers.base import Event
from pipeline.decoder import FrameMeta

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
"""A file name that cannot escape the directory (a run id is one)."""


def thumbnail_size(width: int, height: int, max_width: int) -> tuple[int, int]:
    """``(width, height)`` capped to ``max_width`` with the aspect kept, both even, >= 2."""
    if width > max_width:
        height = round(height * max_width / width)
        width = max_width
    return max(2, width - width % 2), max(2, height - height % 2)


class Thumbnailer:
    """Periodic JPEG of one video track (module doc)."""

    def __init__(
        self,
        directory: Path | None,
        name: str,
        *,
        interval_s: float = 10.0,
        max_width: int = 640,
        quality: int = 5,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"thumbnail name {name!r} is not a plain file name")
        if interval_s < 0:
            raise ValueError("interval_s must not be negative (0: no thumbnails)")
        if max_width < 2:
            raise ValueError("max_width must be at least 2")
        if not 2 <= quality <= 31:
            raise ValueError("quality is an MJPEG quantizer, 2..31")
        self.directory = directory
        self.path = directory / f"{name}.jpg" if directory is not None else None
        self.interval_s = interval_s
        self.max_width = max_width
        self.quality = quality
        self.encoded = 0
        self.written = 0
        self.write_errors = 0
        self._lock = threading.Lock()  # guards _latest (read from any thread)
        self._latest: bytes | None = None
        self._latest_size: tuple[int, int] | None = None
        self._next_at: float | None = None
        self._reformatter = VideoReformatter()
        self._made_directory = False

    def latest(self) -> bytes | None:
        """The newest JPEG (None before the first one). Any thread."""
        with self._lock:
            return self._latest

    def latest_size(self) -> tuple[int, int] | None:
        """``(width, height)`` of :meth:`latest`. Any thread."""
        with self._lock:
            return self._latest_size

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[Event]:
        """Encode ``frame`` if a thumbnail is due (and write it). Never emits an event.

        Blocking: a file write on the calling (worker) thread; never call it on the loop.
        """
        if self.interval_s <= 0:
            return []
        now = meta.decoded_at
        if self._next_at is not None and now < self._next_at:
            return []
        self._next_at = now + self.interval_s
        jpeg, size = self.encode(frame)
        with self._lock:
            self._latest, self._latest_size = jpeg, size
        if self.path is not None:
            self._write(jpeg)
        return []

    def encode(self, frame: av.VideoFrame) -> tuple[bytes, tuple[int, int]]:
        """One JPEG of ``frame`` and its size.

        A fresh encoder per picture (opening one costs well under a millisecond, once
        per interval): a JPEG needs no state from the previous one, and a long-lived
        encoder would insist on rising timestamps, which a decoder reset or a new sender
        clock does not promise. ``frame`` itself is never modified.
        """
        width, height = thumbnail_size(frame.width, frame.height, self.max_width)
        picture = self._reformatter.reformat(
            frame, width=width, height=height, format="yuvj420p", interpolation="AREA", threads=1
        )
        encoder = av.CodecContext.create("mjpeg", "w")
        assert isinstance(encoder, av.VideoCodecContext)
        encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuvj420p"
        encoder.time_base = picture.time_base or fractions.Fraction(1, 90000)
        # A fixed quantizer (FFmpeg's -q:v): the rate control has nothing to aim at.
        encoder.qmin = encoder.qmax = self.quality
        jpeg = b"".join(bytes(packet) for packet in encoder.encode(picture))
        if not jpeg:
            raise RuntimeError(f"mjpeg encoder returned nothing for a {width}x{height} frame")
        self.encoded += 1
        return jpeg, (width, height)

    def _write(self, jpeg: bytes) -> None:
        assert self.path is not None and self.directory is not None
        temp: str | None = None
        try:
            if not self._made_directory:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._made_directory = True
            fd, temp = tempfile.mkstemp(
                dir=self.directory, prefix=f".{self.path.name}.", suffix=".tmp"
            )
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o644)  # mkstemp makes 0600; a preview is not secret
                out.write(jpeg)
            os.replace(temp, self.path)
            temp = None
            self.written += 1
        except OSError as exc:
            self.write_errors += 1
            first = self.write_errors == 1 or self.write_errors % 100 == 0
            level = logging.WARNING if first else logging.DEBUG
            logger.log(
                level,
                "thumbnail %s: write failed (%d so far): %s",
                self.path,
                self.write_errors,
                exc,
            )
        finally:
            if temp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
