"""Keyframe requests (RTCP PLI), paced.

:func:`schedule_pli` is the ``on_need_keyframe`` of a :class:`pipeline.intake.FrameIntake`:
it sends :func:`send_pli` for the receiver as a task, paced by :class:`PliPacer`.

aiortc private names touched (:func:`internals_problems` verifies each):
``RTCRtpReceiver._RTCRtpReceiver__remote_streams``, ``._RTCRtpReceiver__rtx_ssrc``,
``._RTCRtpReceiver__codecs`` and ``._send_rtcp_pli(media_ssrc)``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import aiortc.rtcrtpreceiver

logger = logging.getLogger(__name__)

_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver
_REMOTE_STREAMS = "_RTCRtpReceiver__remote_streams"
_RTX_SSRC = "_RTCRtpReceiver__rtx_ssrc"
_CODECS = "_RTCRtpReceiver__codecs"


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


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    init = inspect.getsource(_RECEIVER.__init__)
    for name in ("__remote_streams", "__rtx_ssrc", "__codecs"):
        if f"self.{name}" not in init:
            problems.append(f"RTCRtpReceiver.{name}")
    pli = getattr(_RECEIVER, "_send_rtcp_pli", None)
    if not (
        inspect.iscoroutinefunction(pli)
        and list(inspect.signature(pli).parameters) == ["self", "media_ssrc"]
    ):
        problems.append("RTCRtpReceiver._send_rtcp_pli(media_ssrc)")
    return problems
