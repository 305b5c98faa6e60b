"""Encoded-frame intake: complete encoded frames into a bounded per-track queue.

:class:`FrameIntake` is a bounded queue between the event loop (producer: the WebRTC
adapter's tap, :mod:`whip.rtc.tap`) and one decode worker thread (consumer), with
keyframe-aware dropping (ARCHITECTURE.md "Flow of one push", step 3). The frame itself is
:class:`pipeline.frame.EncodedFrame`; this module knows nothing of aiortc.

Memory bound: a queue holds at most ``depth`` frames of at most ``payload_limit`` bytes
each, so queued payload <= ``depth x payload_limit``: the figure the session's media
permit reserved per track (:func:`payload_limit_for`). Outside that bound, and not
reserved: the one frame a worker is decoding, FFmpeg's reference frames, and aiortc's
jitter buffer (at most 512 RTP packets for video, 16 for audio; a datagram is at most
1500 bytes, :mod:`whip.rtc.rtp_guard`).

Dropping (video): a frame larger than ``payload_limit``, or one that meets a full queue,
is dropped and counted (an oversized one also as ``oversized_frames``: aiortc's jitter
buffer bounds a frame to 512 RTP packets of at most 1500 bytes, about 750 KB, so a limit
above that never fires), and a *drop episode* starts: every later frame is dropped until a
keyframe fits, and ``on_need_keyframe()`` is called once at the start of the episode
(the owner sends a PLI). If the keyframe that would end an episode is itself dropped
(queue still full), a new episode starts and asks again: a sender that makes keyframes
only on request (browsers) would otherwise never be asked twice. FFmpeg's WHIP muxer
ignores PLI (docs/INTEROP.md section 4), so recovery can take a whole GOP. The decode
worker can start an episode too (:meth:`FrameIntake.request_keyframe`, after a decode
error), and so can the producer for a frame it could not make
(:meth:`FrameIntake.frame_lost`: a payload that did not assemble). Audio frames are all
independently decodable: an audio drop loses that frame only and never asks for anything.

Threads: :meth:`FrameIntake.offer` and ``on_need_keyframe`` run on the event loop
thread; :meth:`FrameIntake.get` runs on the one worker thread; :meth:`FrameIntake.close`
and the counters may be used from any thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pipeline.frame import EncodedFrame, Kind
from pipeline.keyframes import is_keyframe

logger = logging.getLogger(__name__)


class CodecLike(Protocol):
    """What :meth:`FrameIntake.offer` reads of a codec description (aiortc's
    ``RTCRtpCodecParameters`` fits)."""

    @property
    def name(self) -> str: ...


FrameObserver = Callable[[EncodedFrame, Mapping[str, object] | None], None]
"""``observer(frame, codec_parameters)``: see :meth:`FrameIntake.set_observer`."""


class JitterFrameLike(Protocol):
    """What :meth:`FrameIntake.offer` reads of a depacketized frame (aiortc's
    ``JitterFrame`` fits)."""

    @property
    def data(self) -> bytes: ...

    @property
    def timestamp(self) -> int: ...


def payload_limit_for(permit_bytes: int, tracks: int, depth: int) -> int:
    """The per-frame payload limit that keeps ``tracks`` queues of ``depth`` frames within
    ``permit_bytes`` (the media permit's byte reservation). Raises ``ValueError`` when the
    permit cannot hold one byte per slot."""
    if tracks < 1 or depth < 1:
        raise ValueError("tracks and depth must be at least 1")
    limit = permit_bytes // (tracks * depth)
    if limit < 1:
        raise ValueError(f"a permit of {permit_bytes} bytes cannot hold {tracks} x {depth} frames")
    return limit


# ---------------------------------------------------------------- the queue


@dataclass(frozen=True, slots=True)
class IntakeStats:
    """A consistent reading of one intake's counters (taken under its lock).

    Every offered frame is in exactly one of: delivered, dropped, empty, queued
    (``frames_in == delivered + dropped_frames + empty_frames + depth``).
    """

    frames_in: int
    bytes_in: int
    keyframes: int
    delivered: int
    dropped_frames: int
    dropped_bytes: int
    oversized_frames: int
    """Of the dropped frames, those larger than ``payload_limit``."""
    empty_frames: int
    depth: int
    max_depth: int
    keyframe_requests: int
    closed: bool
    lost_frames: int = 0
    """Frames that never reached the queue because they did not assemble
    (:meth:`FrameIntake.frame_lost`); not part of ``frames_in``."""


class FrameIntake:
    """A bounded, keyframe-aware queue of :class:`EncodedFrame` for one track.

    Ownership: the session's pipeline owns it. One producer, the event loop thread
    (:meth:`offer` / :meth:`put`, never blocking); one consumer, the track's worker
    thread (:meth:`get`). :meth:`close`, :meth:`request_keyframe` and :meth:`stats` are
    safe from any thread. All state is guarded by one lock, a leaf: no callback is ever
    called while it is held. The plain-int counters may also be read without the lock
    (each read is atomic under the GIL; use :meth:`stats` for a consistent set).

    ``on_need_keyframe`` runs on the producer's thread inside :meth:`offer` (i.e. inside
    aiortc's RTP handling): it must not block; it should schedule a PLI
    (:func:`whip.rtc.pli.schedule_pli`) as a task. An exception from it is logged and swallowed.

    ``layer``: the simulcast layer (RID) a further decoded layer's intake carries, None
    for a track's own intake; the supervisor gives a layer's decoded frames to no
    analyzer (:class:`pipeline.supervisor.Supervisor`).
    """

    def __init__(
        self,
        kind: Kind,
        *,
        depth: int,
        payload_limit: int,
        on_need_keyframe: Callable[[], None] | None = None,
        label: str = "",
        offered_fmtp: Mapping[int, Mapping[str, object]] | None = None,
        layer: str | None = None,
    ) -> None:
        """``offered_fmtp``: the publisher's offer's ``a=fmtp`` parameters by payload type
        (from the SDP itself: the WebRTC stack's negotiated codec carries its own local
        parameters, not the offer's), handed to the observer (:meth:`set_observer`)."""
        if kind not in ("video", "audio"):
            raise ValueError(f"kind must be 'video' or 'audio', not {kind!r}")
        if depth < 1 or payload_limit < 1:
            raise ValueError("depth and payload_limit must be at least 1")
        self.kind: Kind = kind
        self.depth_limit = depth
        self.payload_limit = payload_limit
        self.label = label or kind
        self.layer = layer
        self._on_need_keyframe = on_need_keyframe
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[EncodedFrame] = collections.deque()
        self._closed = False
        self._resync = False
        """Video: dropping until a keyframe fits (a drop episode is open)."""
        self._request_pending = False
        """A keyframe request was raised off the loop thread; the next offer makes it."""
        self.frames_in = 0
        self.bytes_in = 0
        self.keyframes = 0
        self.delivered = 0
        self.dropped_frames = 0
        self.dropped_bytes = 0
        self.oversized_frames = 0
        self.empty_frames = 0
        self.max_depth = 0
        self.keyframe_requests = 0
        self.lost_frames = 0
        self._offered_fmtp: Mapping[int, Mapping[str, object]] = offered_fmtp or {}
        self.codec_parameters: Mapping[str, object] | None = None
        """The offer's fmtp of the payload type of the last :meth:`offer` (None: unknown)."""
        self._observer: FrameObserver | None = None

    def set_observer(self, observer: FrameObserver | None) -> None:
        """Have ``observer(frame, codec_parameters)`` called for every frame :meth:`put`
        takes, queued or dropped, on the producer's thread after the lock is released
        (:meth:`pipeline.stream_lint.StreamLint.observe`). It must not block; what it
        raises propagates out of :meth:`put` (the tap reports it as a fault)."""
        self._observer = observer

    def add_observer(self, observer: FrameObserver) -> None:
        """Have ``observer`` called too, after the ones already set (the recorder's
        :meth:`pipeline.recording.recorder.SessionRecorder.observe` beside the linting's);
        the same rules as :meth:`set_observer`. Call before frames flow."""
        first = self._observer
        if first is None:
            self._observer = observer
            return

        def both(frame: EncodedFrame, parameters: Mapping[str, object] | None) -> None:
            first(frame, parameters)
            observer(frame, parameters)

        self._observer = both

    # ----------------------------------------------------------- producer side

    def offer(self, codec: CodecLike, frame: JitterFrameLike) -> bool:
        """Take one aiortc frame (the tap's sink). Never blocks; True if it was queued."""
        data = bytes(frame.data)
        payload_type: object = getattr(codec, "payloadType", None)
        if isinstance(payload_type, int):
            self.codec_parameters = self._offered_fmtp.get(payload_type)
        return self.put(
            EncodedFrame(
                kind=self.kind,
                codec=codec.name,
                data=data,
                timestamp=frame.timestamp,
                keyframe=is_keyframe(codec.name, data),
                arrival=time.monotonic(),
            )
        )

    def put(self, frame: EncodedFrame) -> bool:
        """Queue ``frame`` or drop it (module doc). Never blocks; True if it was queued."""
        size = len(frame.data)
        ask = False
        with self._cond:
            self.frames_in += 1
            self.bytes_in += size
            if frame.keyframe:
                self.keyframes += 1
            if self._request_pending:
                self._request_pending = False
                ask = True
            if self._closed:
                queued = self._drop_locked(size)
            elif size == 0:
                # An empty packet would flush (end) an FFmpeg decoder: never queue one.
                self.empty_frames += 1
                queued = False
            elif self._resync and not frame.keyframe:
                queued = self._drop_locked(size)
            elif size > self.payload_limit or len(self._queue) >= self.depth_limit:
                queued = self._drop_locked(size)
                if self.kind == "video":
                    # A new episode, or a keyframe that would have ended one was lost.
                    ask = ask or not self._resync or frame.keyframe
                    self._resync = True
            else:
                self._resync = False
                self._queue.append(frame)
                self.max_depth = max(self.max_depth, len(self._queue))
                self._cond.notify()
                queued = True
            if not queued and size > self.payload_limit:
                self.oversized_frames += 1
            if ask:
                self.keyframe_requests += 1
        if ask:
            self._ask_for_keyframe()
        if self._observer is not None:
            self._observer(frame, self.codec_parameters)
        return queued

    def frame_lost(self) -> None:
        """A frame the producer could not make (its payload did not assemble). Producer
        thread, never blocks. Counted in ``lost_frames``; for video a drop episode opens
        (every frame is dropped until a keyframe) and ``on_need_keyframe`` is called, once
        per episode, as for a frame the queue dropped. Audio: only counted."""
        ask = False
        with self._cond:
            self.lost_frames += 1
            if self.kind == "video" and not self._closed:
                ask = not self._resync
                self._resync = True
                if ask:
                    self.keyframe_requests += 1
        if ask:
            self._ask_for_keyframe()

    def _drop_locked(self, size: int) -> bool:
        self.dropped_frames += 1
        self.dropped_bytes += size
        return False

    def _ask_for_keyframe(self) -> None:
        logger.info("%s: dropping to the next keyframe; asking the sender for one", self.label)
        if self._on_need_keyframe is None:
            return
        try:
            self._on_need_keyframe()
        except Exception:
            logger.exception("%s: on_need_keyframe failed", self.label)

    def request_keyframe(self) -> None:
        """Open a drop episode from any thread (the worker, after a decode error).

        Video only (a no-op for audio). Frames are dropped from now on until a keyframe;
        ``on_need_keyframe`` is called by the next :meth:`offer`, on the producer's
        thread, unless an episode was already open. If a keyframe is already queued, the
        worker reaches that recovery point by itself: nothing is dropped and nobody is
        asked for a keyframe (the queue is scanned only on this error path).
        """
        if self.kind != "video":
            return
        with self._cond:
            if self._resync or self._closed:
                return
            if any(frame.keyframe for frame in self._queue):
                return
            self._resync = True
            self._request_pending = True

    def close(self, *, drain: bool = True) -> None:
        """End the stream (idempotent, any thread, never blocks).

        The end-of-stream mark is a flag, not a queue slot, so it always fits. With
        ``drain`` the worker still gets the queued frames, then end-of-stream; without,
        the queued frames are discarded (counted as dropped) and the worker's next
        :meth:`get` returns end-of-stream. Frames offered after close are dropped.
        """
        with self._cond:
            if not drain:
                while self._queue:
                    self._drop_locked(len(self._queue.popleft().data))
            self._closed = True
            self._cond.notify_all()

    # ----------------------------------------------------------- consumer side

    def get(self, timeout: float | None = None) -> EncodedFrame | None:
        """The next frame, or None at end of stream (and on every call after it).

        Blocks the calling (worker) thread up to ``timeout`` seconds (None: until a frame
        or end of stream); raises ``TimeoutError`` when it runs out. Never call it on the
        event loop thread.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue and not self._closed:
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                timed_out = remaining <= 0 or not self._cond.wait(remaining)
                if timed_out and not self._queue and not self._closed:
                    raise TimeoutError(f"{self.label}: no frame within {timeout} s")
            if self._queue:
                self.delivered += 1
                return self._queue.popleft()
            return None

    # ----------------------------------------------------------- readings

    @property
    def depth(self) -> int:
        """Frames queued now."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    def stats(self) -> IntakeStats:
        """A consistent reading of the counters."""
        with self._cond:
            return IntakeStats(
                frames_in=self.frames_in,
                bytes_in=self.bytes_in,
                keyframes=self.keyframes,
                delivered=self.delivered,
                dropped_frames=self.dropped_frames,
                dropped_bytes=self.dropped_bytes,
                oversized_frames=self.oversized_frames,
                empty_frames=self.empty_frames,
                depth=len(self._queue),
                max_depth=self.max_depth,
                keyframe_requests=self.keyframe_requests,
                closed=self._closed,
                lost_frames=self.lost_frames,
            )
