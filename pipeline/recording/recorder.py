"""One session's recorder: a bounded queue and a named thread that remuxes into segments.

Rules:

- Who writes: one thread per recorded session, ``record-<session>``, the only user of
  its :class:`~pipeline.recording.segment.SegmentFile`. Nothing is written on the event
  loop and nothing here blocks the decode workers: the producer side,
  :meth:`SessionRecorder.observe`, runs where the intake takes the frame (the loop
  thread, :meth:`pipeline.intake.FrameIntake.put`), never blocks and never raises for
  media: it appends to the recorder's own queue or drops.
- Bounded queue: at most ``max_frames`` frames and ``max_bytes`` payload bytes. A video
  frame that does not fit is dropped and every later video frame too, until a keyframe
  fits (a segment can only continue decodably from one); an audio frame that does not
  fit is dropped alone. Every drop is counted (``dropped_frames``) and reported in the
  next ``recording_segment`` event of the run.
- What is recorded: the first video intake and the first audio intake of the session
  (a further simulcast layer decoded with ``pipeline.simulcast = "all"`` is not); the
  frames the intake saw, queued or dropped by decoding, so decode drops do not make
  holes in the recording.
- Segments: the first one opens at the first video keyframe whose parameter sets are
  complete (audio-only sessions: at the first audio frame); audio before it is not
  recorded. A keyframe at least ``segment_s`` after the segment's start, or whose
  codec configuration differs (a simulcast layer switch, a new size), closes the
  segment and opens the next at that keyframe. When a segment closes, the
  ``recording_segment`` event is emitted with ``index, name, start_ms, duration_ms,
  bytes, video_frames, audio_frames, dropped_frames`` and the segment joins the store.
- Time: every track's frames keep their RTP spacing (the depacketizer's timestamps,
  from 0, unwrapped); the tracks are put on one media time line by
  :class:`pipeline.recording.lipsync.LipSync`: by the arrival of each track's first frame
  (the first frame of the session is media time 0) until both tracks have an RTCP sender
  report, then by the reports' common NTP clock, each correction moving one track later,
  never earlier (that module's rules). The reports come from the WebRTC adapter
  (:meth:`SessionRecorder.sender_report`, :mod:`whip.rtc.sender_reports`); the latest of
  each track is taken before the next frame is timed. ``start_ms`` is the segment's start
  in that media time; ``duration_ms`` is its video's (its last frame's time plus one
  frame interval), or its audio's for audio only. Audio that arrives before the keyframe
  that closes a segment stays in that segment, so a segment's audio may run past its
  video by the arrival skew (tens of ms).
- Failure: an ``OSError`` (a full disk, a read-only or missing directory) or an FFmpeg
  error while writing, or a disk budget that cannot be met, emits one
  ``recording_failed`` (``error``, ``index``) and ends the recording of the session;
  the push goes on (it is not a worker fault), later frames are dropped and counted.
- Stop: :meth:`SessionRecorder.close` (any thread) ends the queue; the thread writes
  what was queued, closes the open segment (emitting its event) and exits.
  :meth:`SessionRecorder.stop_async` waits for that on the loop, up to a deadline; a
  thread that misses it is left to finish on its own (daemon) and logged.

Locks: ``_cond`` guards the queue and the counters the producer touches; it is a leaf
(``emit``, the store and every file operation run without it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import av

from pipeline.frame import EncodedFrame, Kind
from pipeline.recording.codec_setup import config_signature
from pipeline.recording.lipsync import LipSync, SenderReport
from pipeline.recording.segment import (
    EXTENSIONS,
    SegmentFile,
    SegmentFormat,
    SetupError,
    VideoSetup,
    probe_video,
)
from pipeline.recording.store import RecordingStore, SegmentEntry, segment_name

logger = logging.getLogger(__name__)

VIDEO_HZ = 90000
AUDIO_HZ = 48000
OPUS_FRAME = 960
DEFAULT_MAX_FRAMES = 512
DEFAULT_MAX_BYTES = 16 << 20

Emit = Callable[[str, dict[str, object]], None]


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    segment_s: float = 60.0
    format: SegmentFormat = "fmp4"
    max_frames: int = DEFAULT_MAX_FRAMES
    max_bytes: int = DEFAULT_MAX_BYTES


class _Open:
    """The segment being written and what its rotation compares (thread only)."""

    def __init__(
        self, index: int, file: SegmentFile, start_s: float, setup: VideoSetup | None
    ) -> None:
        self.index = index
        self.file = file
        self.start_s = start_s
        self.setup = setup
        self.signature = b""
        self.dropped = 0


class SessionRecorder:
    """The recorder of one session (module doc)."""

    def __init__(
        self,
        run_id: str,
        label: str,
        store: RecordingStore,
        emit: Emit,
        *,
        settings: RecorderSettings,
        has_video: bool,
        has_audio: bool,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.run_id = run_id
        self.label = label
        self.store = store
        self._emit = emit
        self.settings = settings
        self.has_video = has_video
        self.has_audio = has_audio
        self._loop = loop
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[EncodedFrame] = collections.deque()
        self._queued_bytes = 0
        self._closed = False
        self._video_resync = False
        self.failed: str | None = None
        """The error that ended the recording (None: it did not fail)."""
        self.frames_in = 0
        self.dropped_frames = 0
        self._dropped_reported = 0
        self.segments = 0
        self.bytes_written = 0
        self.skipped_keyframes = 0
        """Keyframes a segment could not open (or rotate) at: no parameter sets, or a
        codec that is not recordable (thread only)."""
        self._thread: threading.Thread | None = None
        self._exited = asyncio.Event() if loop is not None else None
        self._reports: dict[Kind, SenderReport] = {}
        """The latest sender report per track not yet taken by the thread (under _cond)."""
        # Thread side.
        self.sync = LipSync()
        """The tracks' media time (thread only; read it after :meth:`join`)."""
        self._taken: dict[Kind, SenderReport] = {}
        self._open: _Open | None = None
        self._next_index = 0

    # ------------------------------------------------------------ producer (loop thread)

    def observe(self, frame: EncodedFrame, _parameters: Mapping[str, object] | None) -> None:
        """The intake observer (:meth:`pipeline.intake.FrameIntake.add_observer`): queue
        ``frame`` or drop it (module doc). Never blocks."""
        size = len(frame.data)
        if size == 0:
            return
        with self._cond:
            self.frames_in += 1
            if self._closed or self.failed is not None:
                self.dropped_frames += 1
                return
            video = frame.kind == "video"
            if video and self._video_resync and not frame.keyframe:
                self.dropped_frames += 1
                return
            full = (
                len(self._queue) >= self.settings.max_frames
                or self._queued_bytes + size > self.settings.max_bytes
            )
            if full:
                self.dropped_frames += 1
                if video:
                    self._video_resync = True
                return
            if video:
                self._video_resync = False
            self._queue.append(frame)
            self._queued_bytes += size
            self._cond.notify()

    def sender_report(self, kind: Kind, timestamp: int, ntp_s: float) -> None:
        """An RTCP sender report of the ``kind`` track: ``timestamp`` (on its frames'
        timeline) was at ``ntp_s`` on the publisher's wall clock (module doc: Time).
        Any thread; never blocks; only the latest per track is kept."""
        with self._cond:
            if not self._closed and self.failed is None:
                self._reports[kind] = SenderReport(timestamp, ntp_s)

    @property
    def queued(self) -> int:
        """Frames waiting for the thread now (any thread)."""
        return len(self._queue)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread = threading.Thread(target=self._run, name=f"record-{self.label}", daemon=True)
        self._thread.start()
        logger.info("recorder run %s session %s: started", self.run_id, self.label)

    def close(self) -> None:
        """End the queue (any thread, idempotent): the thread finishes what is queued."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    async def stop_async(self, deadline_s: float) -> bool:
        """:meth:`close`, then wait up to ``deadline_s`` for the thread; True when it
        exited. Call on the recorder's loop. Cancellation: the close has happened; only
        the wait is abandoned."""
        self.close()
        if self._thread is None or self._exited is None:
            return True
        try:
            async with asyncio.timeout(deadline_s):
                await self._exited.wait()
        except TimeoutError:
            logger.warning(
                "recorder run %s session %s: still writing after %.1f s; left to finish",
                self.run_id,
                self.label,
                deadline_s,
            )
            return False
        return True

    def join(self, timeout: float) -> bool:
        """Blocking wait for the thread (tests and threads, never the loop)."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    # ------------------------------------------------------------ the thread

    def _next(self) -> EncodedFrame | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            frame = self._queue.popleft()
            self._queued_bytes -= len(frame.data)
            if self._reports:
                self._taken.update(self._reports)
                self._reports.clear()
            return frame

    def _run(self) -> None:
        try:
            while (frame := self._next()) is not None:
                if self.failed is not None:
                    continue
                try:
                    self._write(frame)
                except (OSError, av.FFmpegError) as exc:
                    self._fail(f"{type(exc).__name__}: {exc}")
                except Exception as exc:  # a bug of ours must not become a push fault
                    logger.exception("recorder run %s: unexpected error", self.run_id)
                    self._fail(f"{type(exc).__name__}: {exc}")
            if self.failed is None:
                try:
                    self._finish_segment()
                except (OSError, av.FFmpegError) as exc:
                    self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            if self._open is not None:
                self._open.file.abandon()
                self._open = None
            logger.info(
                "recorder run %s session %s: ended, %d segments, %d bytes, %d frames dropped",
                self.run_id,
                self.label,
                self.segments,
                self.bytes_written,
                self.dropped_frames,
            )
            if self._loop is not None and self._exited is not None:
                # A closed loop (RuntimeError): nobody waits any more.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._exited.set)

    def _fail(self, error: str) -> None:
        index = self._open.index if self._open is not None else self._next_index
        if self._open is not None:
            self._open.file.abandon()
            self._open = None
        with self._cond:
            self.failed = error
            dropped = len(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
            self.dropped_frames += dropped
        logger.error("recorder run %s session %s: failed: %s", self.run_id, self.label, error)
        self._emit("recording_failed", {"error": error[:500], "index": index})

    def _media_s(self, frame: EncodedFrame) -> float:
        """The frame's media time (module doc: Time), after the reports taken so far."""
        before = self.sync.moves_made
        for kind, report in self._taken.items():
            self.sync.report(kind, report)
        self._taken.clear()
        media_s = self.sync.media_s(frame.kind, frame.timestamp, frame.arrival)
        made = self.sync.moves_made - before
        for move in list(self.sync.moves)[-made:] if made else []:
            logger.info(
                "recorder run %s session %s: lip-sync from sender reports: %s later by %.3f s",
                self.run_id,
                self.label,
                move.kind,
                move.by_s,
            )
        return media_s

    def _write(self, frame: EncodedFrame) -> None:
        media_s = self._media_s(frame)
        if frame.kind == "video":
            self._write_video(frame, media_s)
        else:
            self._write_audio(frame, media_s)

    def _write_video(self, frame: EncodedFrame, media_s: float) -> None:
        current = self._open
        if frame.keyframe and (current is None or self._rotates(current, frame, media_s)):
            setup = self._setup(frame)
            if setup is None:
                if current is None:
                    return
            else:
                self._finish_segment()
                current = self._start_segment(media_s, setup, frame)
        if current is None:
            return  # before the first usable keyframe: not recorded
        ts = round((media_s - current.start_s) * VIDEO_HZ)
        current.file.write_video(frame.data, max(ts, 0), frame.keyframe)

    def _rotates(self, current: _Open, frame: EncodedFrame, media_s: float) -> bool:
        if media_s - current.start_s >= self.settings.segment_s:
            return True
        signature = config_signature(frame.codec, frame.data)
        if signature is not None:
            return signature != current.signature
        if frame.codec.upper() == "VP9" and current.setup is not None:
            try:
                setup = probe_video(frame.codec, frame.data)
            except SetupError:
                return False
            return (setup.width, setup.height) != (current.setup.width, current.setup.height)
        return False

    def _setup(self, frame: EncodedFrame) -> VideoSetup | None:
        try:
            return probe_video(frame.codec, frame.data)
        except SetupError as exc:
            self.skipped_keyframes += 1
            if self.skipped_keyframes == 1:  # once: a stream may never give a usable one
                logger.warning("recorder run %s: keyframe skipped: %s", self.run_id, exc)
            return None

    def _write_audio(self, frame: EncodedFrame, media_s: float) -> None:
        current = self._open
        if not self.has_video and (
            current is None or media_s - current.start_s >= self.settings.segment_s
        ):
            self._finish_segment()
            current = self._start_segment(media_s, None, frame)
        if current is None or not current.file.has_audio:
            return
        ts = round((media_s - current.start_s) * AUDIO_HZ)
        if ts < 0:
            return  # from before this segment's keyframe
        current.file.write_audio(frame.data, ts)

    def _start_segment(
        self, media_s: float, setup: VideoSetup | None, frame: EncodedFrame
    ) -> _Open:
        index = self._next_index
        directory = self.store.run_dir(self.run_id)
        directory.mkdir(parents=True, exist_ok=True)
        name = segment_name(index, EXTENSIONS[self.settings.format])
        file = SegmentFile(
            Path(directory / name),
            self.settings.format,
            video=setup,
            video_keyframe=frame.data if setup is not None else None,
            audio=self.has_audio,
        )
        self._next_index += 1
        opened = _Open(index, file, media_s, setup)
        if setup is not None:
            opened.signature = config_signature(frame.codec, frame.data) or b""
        self._open = opened
        logger.info(
            "recorder run %s: segment %s opened at %.3f s%s",
            self.run_id,
            name,
            media_s,
            f" ({setup.codec} {setup.width}x{setup.height})" if setup else "",
        )
        return opened

    def _finish_segment(self) -> None:
        """Close the open segment (if any), emit its event, add it to the store, then
        hold the disk budget (a budget that cannot be met fails the recording)."""
        current = self._open
        if current is None:
            return
        self._open = None
        file = current.file
        size = file.close()
        video_end = file.last_video_ts / VIDEO_HZ
        if file.video_frames > 1:
            video_end += video_end / (file.video_frames - 1)
        audio_end = (file.last_audio_ts + OPUS_FRAME) / AUDIO_HZ if file.audio_frames else 0.0
        duration_ms = round((video_end if file.video_frames else audio_end) * 1000)
        start_ms = round(current.start_s * 1000)
        with self._cond:
            dropped = self.dropped_frames - self._dropped_reported
            self._dropped_reported = self.dropped_frames
        self.segments += 1
        self.bytes_written += size
        self.store.add(self.run_id, SegmentEntry(file.path.name, size, duration_ms, start_ms))
        self._emit(
            "recording_segment",
            {
                "index": current.index,
                "name": file.path.name,
                "start_ms": start_ms,
                "duration_ms": duration_ms,
                "bytes": size,
                "video_frames": file.video_frames,
                "audio_frames": file.audio_frames,
                "dropped_frames": dropped,
            },
        )
        if not self.store.enforce_budget(live_run=self.run_id):
            raise OSError(f"recordings are over the disk budget of {self.store.max_bytes} bytes")
