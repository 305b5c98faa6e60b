"""The decode worker: one track's :class:`~pipeline.intake.FrameIntake` -> PyAV frames.

:func:`decoder_worker` is a plain function run on its own named thread (by
:class:`pipeline.supervisor.Supervisor`, ``decode-<kind>-<session>``). It takes frames
from the intake until end of stream, decodes them with ``av.CodecContext`` and hands each
decoded frame to an optional ``on_frame(frame, meta)`` callback on the same thread (the
analyzers come later). Bad media is counted, never raised: an ``av.FFmpegError``
(``InvalidDataError`` and friends) is a decode error. Anything else, including an
exception from ``on_frame``, propagates out of the worker: it is the worker's failure
and the supervisor reports it as a fault.

Video resynchronisation: the worker decodes nothing until the first keyframe, and after
a decode error it skips to the next keyframe (counted as ``skipped``) and asks the intake
to do the same (:meth:`~pipeline.intake.FrameIntake.request_keyframe`, which makes the
loop side send a PLI). Decoding inter frames whose references are broken only produces
damaged pictures that would mislead the analyzers. Consequence: an H.264 sender that
never sends an IDR (pure intra refresh) is never decoded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import av

from pipeline.frame import EncodedFrame, Kind
from pipeline.intake import FrameIntake

logger = logging.getLogger(__name__)

DECODERS = {
    "H264": "h264",
    "H265": "hevc",
    "HEVC": "hevc",
    "AV1": "libdav1d",
    "VP9": "vp9",
    "VP8": "vp8",
    "OPUS": "opus",
    "PCMU": "pcm_mulaw",
    "PCMA": "pcm_alaw",
    "G722": "g722",
}
"""aiortc codec name (upper-cased) -> FFmpeg decoder. AV1 is dav1d (``libdav1d``), not
FFmpeg's own ``av1`` (a hardware-only wrapper without a hwaccel: it decodes nothing
here); VP9 is FFmpeg's native ``vp9``, not ``libvpx-vp9`` (faster, and sliced threads).
Each honours ``thread_count`` as :func:`open_decoder` sets it (dav1d's own thread pool
is sized from it: with 1, one thread and a frame delay of 1), so the media budget's one
thread per worker holds for every format."""

AUDIO_FORMATS = {
    "opus": (48000, "stereo"),
    "g722": (16000, "mono"),
    "pcm_mulaw": (8000, "mono"),
    "pcm_alaw": (8000, "mono"),
}
"""The stream's rate and layout per audio decoder (RFC 3551). FFmpeg will not open a
G.711 decoder without them: its first decode raised ``ArgumentError``, every later one
``ValueError`` (a worker fault)."""


@dataclass(frozen=True, slots=True)
class FrameMeta:
    """What ``on_frame`` learns about a decoded frame besides the frame itself."""

    kind: Kind
    codec: str
    index: int
    """0 for the track's first decoded frame, then +1 per frame."""
    timestamp: int
    """RTP timestamp of the encoded frame whose decode produced it (see EncodedFrame)."""
    keyframe: bool
    """That encoded frame was a keyframe."""
    arrival: float
    """``time.monotonic()`` when that encoded frame reached the intake."""
    decoded_at: float


FrameCallback = Callable[[av.VideoFrame | av.AudioFrame, FrameMeta], None]


class DecodeStats:
    """One track's decode counters.

    Written only by the worker thread; read from any thread. Every field is a plain int,
    float, str or None rebound by one assignment, so each read is atomic under the GIL;
    two fields read one after the other may come from different moments (fine for
    stats; nothing decides on a pair of them).
    """

    __slots__ = (
        "channels",
        "codec",
        "decode_errors",
        "first_decoded_at",
        "frames_decoded",
        "frames_in",
        "height",
        "kind",
        "last_decoded_at",
        "last_error",
        "pix_fmt",
        "sample_rate",
        "skipped",
        "width",
    )

    def __init__(self, kind: Kind) -> None:
        self.kind: Kind = kind
        self.codec: str | None = None
        self.frames_in = 0
        """Encoded frames taken from the intake."""
        self.frames_decoded = 0
        self.decode_errors = 0
        self.skipped = 0
        """Encoded frames not decoded: empty, waiting for a keyframe, or keyframes-only."""
        self.last_error: str | None = None
        self.width: int | None = None
        self.height: int | None = None
        self.pix_fmt: str | None = None
        self.sample_rate: int | None = None
        self.channels: int | None = None
        self.first_decoded_at: float | None = None
        self.last_decoded_at: float | None = None

    def as_dict(self) -> dict[str, object]:
        """The counters as a dict (for events and ``GET /v1/sessions``)."""
        return {name: getattr(self, name) for name in self.__slots__}


Decoder = av.VideoCodecContext | av.AudioCodecContext


def open_decoder(codec: str, codec_threads: int = 1, max_pixels: int | None = None) -> Decoder:
    """A PyAV decoder for aiortc's codec name (``H264``, ``VP8``, ``opus``, ...).

    ``codec_threads`` is FFmpeg's thread count (0: FFmpeg decides). More than one
    enables frame threading too, which delays output by up to that many frames (the
    worker flushes them at end of stream). ``max_pixels`` (video only; None: FFmpeg's
    default, no practical limit) is FFmpeg's ``max_pixels`` option: a picture of more
    pixels (its width, which FFmpeg rounds up to a multiple of 64, times its height) is
    refused by the decoder before it allocates it, and ``decode`` raises ``InvalidDataError``
    (``ArgumentError`` for VP8's first one), which the worker counts as a decode error.
    It is the bound on what one session's decoder holds: H.264 keeps up to 16 reference
    pictures, so decoder memory grows with the picture size (an 8K figure is in
    ``docs/PERFORMANCE.md``, "Decoder memory").
    Raises ``ValueError`` for an unknown codec.
    """
    name = DECODERS.get(codec.upper())
    if name is None:
        raise ValueError(f"no decoder for codec {codec!r}")
    context = av.CodecContext.create(name, "r")
    if not isinstance(context, av.VideoCodecContext | av.AudioCodecContext):
        raise ValueError(f"{name} is neither a video nor an audio decoder")
    if name in AUDIO_FORMATS:
        rate, layout = AUDIO_FORMATS[name]
        assert isinstance(context, av.AudioCodecContext)
        context.sample_rate = rate
        context.layout = layout
    # Always set: PyAV's default is 0 (FFmpeg picks one thread per core), so leaving
    # codec_threads=1 unset silently gave every session several decode threads.
    context.thread_count = codec_threads
    if codec_threads != 1:
        context.thread_type = "AUTO"
    if max_pixels is not None and isinstance(context, av.VideoCodecContext):
        # Read when PyAV opens the context, at its first decode().
        context.options = {"max_pixels": str(max_pixels)}
    return context


def decoder_worker(
    intake: FrameIntake,
    stats: DecodeStats,
    *,
    codec_threads: int = 1,
    keyframes_only: bool = False,
    max_pixels: int | None = None,
    on_frame: FrameCallback | None = None,
) -> None:
    """Decode ``intake`` until end of stream (module doc). Runs on its own thread.

    ``codec_threads`` and ``max_pixels`` go to :func:`open_decoder`: a picture over
    ``max_pixels`` is a decode error like any undecodable frame.

    Returns when :meth:`FrameIntake.get` reports end of stream (after flushing the
    decoder). Stopping it: ``intake.close(drain=False)``; it notices at its next ``get``,
    so a worker stuck inside ``on_frame`` is stopped only when the callback returns (the
    supervisor's join deadline covers that). Raises whatever ``on_frame`` raises, and any
    non-FFmpeg error (a bug).
    """
    decoder: Decoder | None = None
    codec: str | None = None
    video = intake.kind == "video"
    resync = video
    asked = False
    while True:
        frame = intake.get()
        if frame is None:
            break
        stats.frames_in += 1
        if frame.codec != codec:
            decoder = open_decoder(frame.codec, codec_threads, max_pixels)
            codec = frame.codec
            stats.codec = codec
            resync = video
        if not frame.data or (video and (resync or keyframes_only) and not frame.keyframe):
            stats.skipped += 1
            if resync and not asked:
                asked = True
                intake.request_keyframe()
            continue
        resync = asked = False
        assert decoder is not None
        packet = av.Packet(frame.data)
        packet.pts = frame.timestamp
        try:
            decoded = decoder.decode(packet)
        except av.FFmpegError as exc:
            stats.decode_errors += 1
            stats.last_error = str(exc)
            logger.debug("%s: decode error on %s frame: %s", intake.label, codec, exc)
            if video:
                resync = True
                asked = True
                intake.request_keyframe()
            continue
        for picture in decoded:
            _deliver(picture, frame, stats, on_frame)
    if decoder is not None:
        try:
            flushed = decoder.decode(None)
        except av.FFmpegError as exc:
            logger.debug("%s: flush failed: %s", intake.label, exc)
            return
        assert frame is None
        for picture in flushed:
            _deliver(picture, None, stats, on_frame)


def _deliver(
    picture: av.VideoFrame | av.AudioFrame,
    source: EncodedFrame | None,
    stats: DecodeStats,
    on_frame: FrameCallback | None,
) -> None:
    now = time.monotonic()
    if isinstance(picture, av.VideoFrame):
        stats.width = picture.width
        stats.height = picture.height
        stats.pix_fmt = picture.format.name
    else:
        stats.sample_rate = picture.sample_rate
        stats.channels = picture.layout.nb_channels
    index = stats.frames_decoded
    stats.frames_decoded = index + 1
    if stats.first_decoded_at is None:
        stats.first_decoded_at = now
    stats.last_decoded_at = now
    if on_frame is None:
        return
    meta = FrameMeta(
        kind=stats.kind,
        codec=stats.codec or "",
        index=index,
        timestamp=source.timestamp if source is not None else (picture.pts or 0),
        keyframe=source.keyframe if source is not None else False,
        arrival=source.arrival if source is not None else now,
        decoded_at=now,
    )
    on_frame(picture, meta)
