"""Encoded-frame intake: aiortc's complete encoded frames into a bounded per-track queue.

Two parts, one direction (ARCHITECTURE.md "Flow of one push", step 3):

1. :func:`install_tap` hooks one aiortc ``RTCRtpReceiver`` so each complete encoded
   frame (a ``JitterFrame``: after depayload and the jitter buffer) goes to a sink, and
   aiortc never starts its own ``decoder_worker`` thread (which would decode every frame
   into an unbounded queue nobody reads). :func:`send_pli` asks the sender for a keyframe.
2. :class:`FrameIntake` is that sink: a bounded queue between the event loop (producer)
   and one decode worker thread (consumer), with keyframe-aware dropping.

Memory bound: a queue holds at most ``depth`` frames of at most ``payload_limit`` bytes
each, so queued payload <= ``depth x payload_limit``: the figure the session's media
permit reserved per track (:func:`payload_limit_for`). Outside that bound, and not
reserved: the one frame a worker is decoding, FFmpeg's reference frames, and aiortc's
jitter buffer (at most 512 RTP packets for video, 16 for audio; a datagram is at most
1500 bytes, :mod:`pipeline.rtp_guard`).

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
error). Audio frames are all independently decodable: an audio drop loses that frame
only and never asks for anything.

aiortc private names touched (here and in :mod:`pipeline.rtp_guard`;
:func:`check_tap_internals` verifies each at start-up and ``tests/test_intake.py`` fails
loudly when one moves):

- ``aiortc.rtcrtpreceiver.threading`` (module global, swapped for the duration of one
  synchronous ``receive()`` step) and ``aiortc.rtcrtpreceiver.decoder_worker``
- ``RTCRtpReceiver.receive`` (wrapped by an instance attribute; its body must not await)
- ``RTCRtpReceiver._RTCRtpReceiver__decoder_queue`` (replaced by a write-only sink)
- ``RTCRtpReceiver._RTCRtpReceiver__decoder_thread`` (must end up as our stand-in)
- ``RTCRtpReceiver._RTCRtpReceiver__started``
- ``RTCRtpReceiver._RTCRtpReceiver__stop_decoder`` (its ``put(None)`` is end-of-stream)
- ``RTCRtpReceiver._handle_rtp_packet`` (the ``__decoder_queue.put((codec, frame))``
  we receive, gated on ``__decoder_thread`` being truthy)
- ``RTCRtpReceiver._RTCRtpReceiver__remote_streams``, ``._RTCRtpReceiver__rtx_ssrc``,
  ``._RTCRtpReceiver__codecs`` and ``._send_rtcp_pli(media_ssrc)`` (PLI)
- ``aiortc.jitterbuffer.JitterFrame`` (``data``, ``timestamp``)
- ours, added to the receiver: ``_whip_ingest_tap`` (the :class:`ReceiverTap`; a second
  :func:`install_tap` on the same receiver is refused)
- and what :mod:`pipeline.rtp_guard` touches: :func:`install_tap` guards every receiver
  it taps and its transport (hostile RTP refused or bounded, and counted)

Threads: the tap, :meth:`FrameIntake.offer` and ``on_need_keyframe`` run on the event
loop thread; :meth:`FrameIntake.get` runs on the one worker thread; :meth:`FrameIntake.close`
and the counters may be used from any thread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiortc
import aiortc.jitterbuffer
import aiortc.rtcrtpreceiver

from pipeline.errors import IncompatibleAiortcError, TapNotInstalledError
from pipeline.keyframes import is_keyframe
from pipeline.rtp_guard import RtpGuard, guard_problems, guard_receiver

logger = logging.getLogger(__name__)

TESTED_AIORTC = "1.16.0"
Kind = Literal["video", "audio"]


# ---------------------------------------------------------------- the frame


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """One complete encoded frame as the decode worker receives it."""

    kind: Kind
    codec: str
    """aiortc's codec name: ``H264``, ``VP8``, ``opus``."""
    data: bytes
    timestamp: int
    """RTP timestamp as aiortc maps it: 0 at the track's first frame, unwrapped (it keeps
    growing past 2**32), in the codec's clock rate (90 kHz video, 48 kHz Opus)."""
    keyframe: bool
    """Decodable without earlier frames (always True for non-empty audio)."""
    arrival: float
    """``time.monotonic()`` when the frame reached the intake."""


class CodecLike(Protocol):
    """What the intake reads of aiortc's ``RTCRtpCodecParameters``."""

    @property
    def name(self) -> str: ...


class JitterFrameLike(Protocol):
    """What the intake reads of aiortc's ``JitterFrame``."""

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
    (:func:`send_pli`) as a task. An exception from it is logged and swallowed.
    """

    def __init__(
        self,
        kind: Kind,
        *,
        depth: int,
        payload_limit: int,
        on_need_keyframe: Callable[[], None] | None = None,
        label: str = "",
    ) -> None:
        if kind not in ("video", "audio"):
            raise ValueError(f"kind must be 'video' or 'audio', not {kind!r}")
        if depth < 1 or payload_limit < 1:
            raise ValueError("depth and payload_limit must be at least 1")
        self.kind: Kind = kind
        self.depth_limit = depth
        self.payload_limit = payload_limit
        self.label = label or kind
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

    # ----------------------------------------------------------- producer side

    def offer(self, codec: CodecLike, frame: JitterFrameLike) -> bool:
        """Take one aiortc frame (the tap's sink). Never blocks; True if it was queued."""
        data = bytes(frame.data)
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
        return queued

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
            )


# ---------------------------------------------------------------- the aiortc tap

_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver
_QUEUE = "_RTCRtpReceiver__decoder_queue"
_THREAD = "_RTCRtpReceiver__decoder_thread"
_STARTED = "_RTCRtpReceiver__started"
_REMOTE_STREAMS = "_RTCRtpReceiver__remote_streams"
_RTX_SSRC = "_RTCRtpReceiver__rtx_ssrc"
_CODECS = "_RTCRtpReceiver__codecs"
_TAP_MARK = "_whip_ingest_tap"
_THREADING = "threading"
"""The module global of aiortc.rtcrtpreceiver swapped during ``receive()``."""

_SWAP_LOCK = threading.Lock()
"""Serialises the module-global ``threading`` swap (a leaf, held for one synchronous
``receive()`` step: microseconds, no I/O)."""


@functools.cache
def _internals_problems() -> tuple[str, ...]:
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    module = aiortc.rtcrtpreceiver
    need(getattr(module, "threading", None) is threading, "aiortc.rtcrtpreceiver.threading")
    need(inspect.isfunction(getattr(module, "decoder_worker", None)), "decoder_worker")
    init = inspect.getsource(_RECEIVER.__init__)
    for name in (
        "__decoder_queue",
        "__decoder_thread",
        "__started",
        "__remote_streams",
        "__rtx_ssrc",
        "__codecs",
    ):
        need(f"self.{name}" in init, f"RTCRtpReceiver.{name}")
    receive = getattr(_RECEIVER, "receive", None)
    need(inspect.iscoroutinefunction(receive), "RTCRtpReceiver.receive is a coroutine")
    if receive is not None:
        body = inspect.getsource(receive)
        need("await" not in body, "RTCRtpReceiver.receive never awaits")
        need("threading.Thread(" in body, "RTCRtpReceiver.receive creates threading.Thread")
        need("target=decoder_worker" in body, "RTCRtpReceiver.receive starts decoder_worker")
        need("self.__decoder_thread.start()" in body, "RTCRtpReceiver.receive starts it")
        need("self.__started = True" in body, "RTCRtpReceiver.receive sets __started")
    handler = getattr(_RECEIVER, "_handle_rtp_packet", None)
    need(inspect.iscoroutinefunction(handler), "RTCRtpReceiver._handle_rtp_packet")
    if handler is not None:
        body = inspect.getsource(handler)
        need(
            "encoded_frame is not None and self.__decoder_thread" in body,
            "_handle_rtp_packet gates on __decoder_thread",
        )
        need(
            "self.__decoder_queue.put((codec, encoded_frame))" in body,
            "_handle_rtp_packet puts (codec, encoded_frame)",
        )
    stop = getattr(_RECEIVER, "_RTCRtpReceiver__stop_decoder", None)
    need(
        stop is not None and "self.__decoder_queue.put(None)" in inspect.getsource(stop),
        "RTCRtpReceiver.__stop_decoder puts None",
    )
    pli = getattr(_RECEIVER, "_send_rtcp_pli", None)
    need(
        inspect.iscoroutinefunction(pli)
        and list(inspect.signature(pli).parameters) == ["self", "media_ssrc"],
        "RTCRtpReceiver._send_rtcp_pli(media_ssrc)",
    )
    jitter = aiortc.jitterbuffer.JitterFrame(b"\x01", 7)
    need(jitter.data == b"\x01" and jitter.timestamp == 7, "JitterFrame(data, timestamp)")
    problems.extend(guard_problems())
    return tuple(problems)


def check_tap_internals() -> None:
    """Raise :class:`IncompatibleAiortcError` naming every aiortc internal the tap relies
    on that moved (call at start-up; the result is cached)."""
    if aiortc.__version__ != TESTED_AIORTC:
        raise IncompatibleAiortcError(
            f"the encoded-frame tap is verified against aiortc {TESTED_AIORTC}, "
            f"found {aiortc.__version__}"
        )
    problems = _internals_problems()
    if problems:
        raise IncompatibleAiortcError(
            "aiortc internals the encoded-frame tap relies on have changed: " + ", ".join(problems)
        )


class _NoThread:
    """Stands in for aiortc's decoder thread: truthy (so ``_handle_rtp_packet`` still
    hands frames over), ``start``/``join`` do nothing, never alive."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def start(self) -> None:
        return None

    def join(self, timeout: float | None = None) -> None:
        return None

    def is_alive(self) -> bool:
        return False


class _ThreadingShim:
    """``threading`` for aiortc.rtcrtpreceiver during one ``receive()`` step: only the
    hooking thread's ``Thread(target=decoder_worker, ...)`` becomes the stand-in; anything
    else (another thread, another attribute) is the real module."""

    def __init__(self, owner: int, stand_in: _NoThread) -> None:
        self._owner = owner
        self._stand_in = stand_in

    def Thread(self, *args: Any, **kwargs: Any) -> Any:
        if (
            threading.get_ident() == self._owner
            and kwargs.get("target") is aiortc.rtcrtpreceiver.decoder_worker
        ):
            return self._stand_in
        return threading.Thread(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


class _SinkQueue:
    """Replaces the receiver's decoder queue: write-only, calls the tap."""

    __slots__ = ("_tap",)

    def __init__(self, tap: ReceiverTap) -> None:
        self._tap = tap

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if item is None:
            self._tap._end()
        else:
            codec, frame = item
            self._tap._deliver(codec, frame)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        raise TapNotInstalledError("the encoded-frame tap's queue is write-only")


Sink = Callable[[Any, Any], object]
"""``sink(codec, jitter_frame)``: aiortc's ``RTCRtpCodecParameters`` and ``JitterFrame``."""


class ReceiverTap:
    """One tapped receiver (made by :func:`install_tap`).

    Lives on the event loop thread. ``receiving`` becomes True once aiortc's
    ``receive()`` ran through the hook and the hook was verified; ``error`` holds why it
    failed otherwise (and ``on_error`` was called with it). ``ended`` is set when aiortc
    stopped the receiver (stop, transport disconnect, RTCP BYE) and ``on_end`` ran.
    """

    def __init__(
        self,
        receiver: Any,
        sink: Sink,
        on_end: Callable[[], object] | None,
        on_error: Callable[[BaseException], object] | None,
    ) -> None:
        self.receiver = receiver
        self.kind: str = receiver.track.kind if receiver.track is not None else "unknown"
        self._sink = sink
        self._on_end = on_end
        self._on_error = on_error
        self.stand_in = _NoThread(f"{self.kind}-decoder (tapped: no thread)")
        self.guard: RtpGuard | None = None
        """The receiver's transport guard (:mod:`pipeline.rtp_guard`), set by install_tap."""
        self.frames = 0
        self.sink_errors = 0
        self.receiving = False
        self.ended = False
        self.error: BaseException | None = None

    def _deliver(self, codec: Any, frame: Any) -> None:
        # Called by aiortc's _handle_rtp_packet: an exception here would kill the DTLS
        # transport's receive loop, so none escapes.
        self.frames += 1
        try:
            self._sink(codec, frame)
        except Exception as exc:
            self.sink_errors += 1
            if self.sink_errors == 1:
                logger.exception("%s tap: sink failed (first of possibly many)", self.kind)
                self._fail(exc)

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self._on_end is None:
            return
        try:
            self._on_end()
        except Exception:
            logger.exception("%s tap: on_end failed", self.kind)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception:
                logger.exception("%s tap: on_error failed", self.kind)

    async def _receive(
        self, original: Callable[[Any], Coroutine[Any, Any, None]], params: Any
    ) -> None:
        try:
            coro = original(params)
            with _SWAP_LOCK:
                module = aiortc.rtcrtpreceiver
                setattr(module, _THREADING, _ThreadingShim(threading.get_ident(), self.stand_in))
                try:
                    # Drive the stock body by hand: it must finish without suspending,
                    # so the swap is never visible to another task.
                    coro.send(None)
                except StopIteration:
                    pass
                else:
                    coro.close()
                    raise TapNotInstalledError(
                        f"{self.kind} tap: RTCRtpReceiver.receive suspended; the hook is invalid"
                    )
                finally:
                    setattr(module, _THREADING, threading)
            self.verify()
        except BaseException as exc:
            self._fail(exc)
            raise
        self.receiving = True

    def verify(self) -> None:
        """Raise :class:`TapNotInstalledError` unless the receiver started with our
        stand-in instead of a decoder thread, and still feeds our sink."""
        receiver = self.receiver
        thread = getattr(receiver, _THREAD, None)
        if not getattr(receiver, _STARTED, False):
            raise TapNotInstalledError(f"{self.kind} tap: receiver did not start")
        if thread is not self.stand_in:
            alive = isinstance(thread, threading.Thread) and thread.is_alive()
            raise TapNotInstalledError(
                f"{self.kind} tap: receiver's decoder thread is {thread!r}"
                f"{' (alive: aiortc decodes every frame)' if alive else ''}, not the stand-in"
            )
        queue = getattr(receiver, _QUEUE, None)
        if not isinstance(queue, _SinkQueue) or queue._tap is not self:
            raise TapNotInstalledError(f"{self.kind} tap: decoder queue was replaced")


def install_tap(
    receiver: Any,
    sink: Sink,
    *,
    on_end: Callable[[], object] | None = None,
    on_error: Callable[[BaseException], object] | None = None,
) -> ReceiverTap:
    """Hook ``receiver`` (an ``RTCRtpReceiver``) so its encoded frames go to ``sink``.

    Call on the event loop thread after ``setRemoteDescription`` (the transceivers exist)
    and before the connection starts receiving (``receive()`` runs after DTLS connects),
    e.g. before ``setLocalDescription``. ``sink(codec, jitter_frame)`` runs on the loop
    thread inside aiortc's RTP handling and must not block (:meth:`FrameIntake.offer`
    fits); an exception from it is logged and reported once through ``on_error``, never
    raised into aiortc. ``on_end()`` runs once when aiortc stops the receiver.

    aiortc calls ``receive()`` from a fire-and-forget task, so a hook that fails to take
    effect can only *report*: ``on_error(exc)`` runs with a
    :class:`TapNotInstalledError` (and the exception is also raised into that task, which
    stops the receiver from starting). The owner should treat it as a session fault.
    The RemoteStreamTrack never gets a frame: nobody may ``recv()`` a tapped track.
    The receiver and its DTLS transport are also guarded against hostile RTP
    (:func:`pipeline.rtp_guard.guard_receiver`; the counters are ``tap.guard``).

    Raises :class:`IncompatibleAiortcError` if aiortc's internals moved, and
    :class:`TapNotInstalledError` if the receiver already started or is already tapped.
    """
    check_tap_internals()
    if getattr(receiver, _TAP_MARK, None) is not None:
        raise TapNotInstalledError("receiver is already tapped")
    if getattr(receiver, _STARTED, True):
        raise TapNotInstalledError("receiver already started: tap it before it connects")
    tap = ReceiverTap(receiver, sink, on_end, on_error)
    tap.guard = guard_receiver(receiver)
    original = receiver.receive

    async def receive(parameters: Any) -> None:
        await tap._receive(original, parameters)

    setattr(receiver, _QUEUE, _SinkQueue(tap))
    receiver.receive = receive
    setattr(receiver, _TAP_MARK, tap)
    return tap


def remote_media_ssrcs(receiver: Any) -> list[int]:
    """The SSRCs the receiver has seen media on (RTX SSRCs excluded)."""
    rtx = getattr(receiver, _RTX_SSRC)
    return [ssrc for ssrc in list(getattr(receiver, _REMOTE_STREAMS)) if ssrc not in rtx]


def pli_negotiated(receiver: Any) -> bool:
    """True when a receive codec negotiated ``nack pli`` (only then does the sender
    promise to answer a PLI; FFmpeg's WHIP muxer does not)."""
    for codec in list(getattr(receiver, _CODECS).values()):
        for feedback in getattr(codec, "rtcpFeedback", None) or []:
            if feedback.type == "nack" and feedback.parameter == "pli":
                return True
    return False


async def send_pli(receiver: Any) -> int:
    """Send an RTCP PLI for every remote media SSRC of ``receiver``; returns how many.

    A receiver without an RTCP SSRC yet (aiortc assigns it at transceiver creation) or a
    closed transport sends nothing (aiortc swallows ``ConnectionError``). Cancellation:
    PLIs already sent stay sent; nothing else to undo.
    """
    ssrcs = remote_media_ssrcs(receiver)
    for ssrc in ssrcs:
        await receiver._send_rtcp_pli(ssrc)
    return len(ssrcs)


PLI_MIN_INTERVAL_S = 0.5
"""At most one PLI per receiver this often. RFC 4585 leaves PLI pacing to the receiver:
without it, a sender whose every keyframe we refuse (over ``pipeline.max_pixels``, or
one that fails to decode) would be asked again at once, in a loop at round-trip speed."""


class PliPacer:
    """Paces keyframe requests: the first one is sent at once, later ones at most every
    ``min_interval_s``. A request inside the interval is not dropped but coalesced: one
    request is sent when the interval ends (a sender that makes keyframes only on
    request, like a browser, must still be asked; the intake asks once per episode).

    Loop thread only. ``send()`` makes the request (a coroutine, run as a task whose
    failure is logged). Counters: ``sent`` (requests made), ``coalesced`` (calls folded
    into a pending or a later request).
    """

    def __init__(
        self,
        send: Callable[[], Coroutine[Any, Any, int]],
        loop: asyncio.AbstractEventLoop | None = None,
        min_interval_s: float = PLI_MIN_INTERVAL_S,
    ) -> None:
        self._send = send
        self._loop = loop
        self._min_interval_s = min_interval_s
        self._last = float("-inf")
        self._deferred: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[int]] = set()
        self.sent = 0
        self.coalesced = 0

    def __call__(self) -> None:
        loop = self._loop or asyncio.get_running_loop()
        if self._deferred is not None:
            self.coalesced += 1
            return
        wait = self._last + self._min_interval_s - loop.time()
        if wait > 0:
            self.coalesced += 1
            self._deferred = loop.call_later(wait, self._fire, loop)
            return
        self._fire(loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deferred = None
        self._last = loop.time()
        self.sent += 1
        task = loop.create_task(self._send(), name="whip-pli")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[int]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("PLI failed: %r", task.exception())


def schedule_pli(
    receiver: Any, loop: asyncio.AbstractEventLoop | None = None
) -> Callable[[], None]:
    """An ``on_need_keyframe`` for :class:`FrameIntake`: sends :func:`send_pli` as a task
    on the loop, paced by a :class:`PliPacer` (call it on the loop thread; it returns at
    once). A request pending when the session closes is sent to a closed transport,
    which aiortc ignores."""
    return PliPacer(lambda: send_pli(receiver), loop)
