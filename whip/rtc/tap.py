"""The encoded-frame tap: aiortc's complete encoded frames go to our sink, never to
aiortc's own decoder thread.

:func:`install_tap` hooks one aiortc ``RTCRtpReceiver`` so each complete encoded frame
(a ``JitterFrame``: after depayload and the jitter buffer) goes to a sink, such as
:meth:`pipeline.intake.FrameIntake.offer`, and aiortc never starts its own
``decoder_worker`` thread (which would decode every frame into an unbounded queue nobody
reads). Every tapped receiver and its transport are also guarded against hostile RTP
(:mod:`whip.rtc.rtp_guard`).

aiortc private names touched (:func:`internals_problems` verifies each; the one start-up
check is :func:`whip.rtc.compat.check_internals`):

- ``aiortc.rtcrtpreceiver.threading`` (module global, swapped for the duration of one
  synchronous ``receive()`` step) and ``aiortc.rtcrtpreceiver.decoder_worker``
- ``RTCRtpReceiver.receive`` (wrapped by an instance attribute; its body must not await)
- ``RTCRtpReceiver._RTCRtpReceiver__decoder_queue`` (replaced by a write-only sink)
- ``RTCRtpReceiver._RTCRtpReceiver__decoder_thread`` (must end up as our stand-in)
- ``RTCRtpReceiver._RTCRtpReceiver__started``
- ``RTCRtpReceiver._RTCRtpReceiver__stop_decoder`` (its ``put(None)`` is end-of-stream)
- ``RTCRtpReceiver._handle_rtp_packet`` (the ``__decoder_queue.put((codec, frame))``
  we receive, gated on ``__decoder_thread`` being truthy)
- ``aiortc.jitterbuffer.JitterFrame`` (``data``, ``timestamp``)
- ours, added to the receiver: ``_whip_ingest_tap`` (the :class:`ReceiverTap`; a second
  :func:`install_tap` on the same receiver is refused)

Payload formats: given ``formats`` (:class:`whip.rtc.depayload.PayloadFormats`), the
``receive(parameters)`` wrapper binds one depacketizer per codec of ours to the receive
parameters' codecs before aiortc's body runs, so the first packet already goes through it.

Threads: the tap and its sink run on the event loop thread.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import aiortc.jitterbuffer
import aiortc.rtcrtpreceiver

from whip.rtc.depayload import PayloadFormats
from whip.rtc.rtp_guard import RtpGuard, guard_receiver
from whip.rtc.rtp_timestamps import install_frame_timestamps

logger = logging.getLogger(__name__)


class TapNotInstalledError(RuntimeError):
    """The encoded-frame tap did not take effect on a receiver (a local fault: aiortc
    would have started its own decoder thread). The owner treats it as a session fault."""

    http_status = 500
    code = "internal"


_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver
_QUEUE = "_RTCRtpReceiver__decoder_queue"
_THREAD = "_RTCRtpReceiver__decoder_thread"
_STARTED = "_RTCRtpReceiver__started"
_TAP_MARK = "_whip_ingest_tap"
_THREADING = "threading"
"""The module global of aiortc.rtcrtpreceiver swapped during ``receive()``."""

_SWAP_LOCK = threading.Lock()
"""Serialises the module-global ``threading`` swap (a leaf, held for one synchronous
``receive()`` step: microseconds, no I/O)."""


def internals_problems() -> list[str]:
    """What the tap relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
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
    jitter = aiortc.jitterbuffer.JitterFrame(b"\x01", 7)
    need(jitter.data == b"\x01" and jitter.timestamp == 7, "JitterFrame(data, timestamp)")
    return problems


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
        """The receiver's transport guard (:mod:`whip.rtc.rtp_guard`), set by install_tap."""
        self.formats: PayloadFormats | None = None
        """The receiver's depacketizers (:mod:`whip.rtc.depayload`), when it has any."""
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
            if self.formats is not None and not getattr(self.receiver, _STARTED, False):
                self.formats.bind(params.codecs)
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
    formats: PayloadFormats | None = None,
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
    (:func:`whip.rtc.rtp_guard.guard_receiver`; the counters are ``tap.guard``), and its
    frame timestamps keep B-frames in order (:mod:`whip.rtc.rtp_timestamps`).
    ``formats`` are bound to the receive parameters when aiortc calls ``receive()``
    (module doc); ``sink`` should then be ``formats.framing(...)``.

    Raises :class:`TapNotInstalledError` if the receiver already started or is already
    tapped. Whether aiortc's internals still have the shape relied on here is checked once,
    at app creation (:func:`whip.rtc.compat.check_internals`), not per receiver.
    """
    if getattr(receiver, _TAP_MARK, None) is not None:
        raise TapNotInstalledError("receiver is already tapped")
    if getattr(receiver, _STARTED, True):
        raise TapNotInstalledError("receiver already started: tap it before it connects")
    tap = ReceiverTap(receiver, sink, on_end, on_error)
    tap.guard = guard_receiver(receiver)
    install_frame_timestamps(receiver)
    tap.formats = formats
    original = receiver.receive

    async def receive(parameters: Any) -> None:
        await tap._receive(original, parameters)

    setattr(receiver, _QUEUE, _SinkQueue(tap))
    receiver.receive = receive
    setattr(receiver, _TAP_MARK, tap)
    return tap


def payload_errors_of(receivers: Iterable[Any]) -> dict[str, dict[str, int]]:
    """The refused packets and frames of ``receivers``' depacketizers, summed: codec name
    -> reason -> count (:meth:`whip.rtc.depayload.PayloadFormats.errors`)."""
    found: dict[str, dict[str, int]] = {}
    for receiver in receivers:
        tap = getattr(receiver, _TAP_MARK, None)
        if not isinstance(tap, ReceiverTap) or tap.formats is None:
            continue
        for codec, reasons in tap.formats.errors().items():
            into = found.setdefault(codec, {})
            for reason, count in reasons.items():
                into[reason] = into.get(reason, 0) + count
    return found
