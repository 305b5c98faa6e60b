"""One segment file: PyAV stream copy of encoded frames into fragmented MP4 or Matroska.

Rules:

- Stream copy only: every packet written is the bytes the publisher's encoder sent
  (the MP4 muxer re-frames H.264/H.265 Annex B NAL units as length-prefixed ones, the
  NAL units themselves unchanged). Nothing is decoded except one keyframe per video
  track setup (:func:`probe_video`: its size and pixel format, which the container
  header needs), and nothing is ever encoded.
- Fragmented MP4: ``movflags=frag_keyframe+empty_moov+default_base_moof`` and
  ``frag_duration`` 1 s, so a fragment is written at every keyframe and at least every
  second; ``flush_packets`` hands each fragment to the OS as it completes. A process
  killed mid-segment leaves a file that plays up to its last complete fragment.
- Timestamps are the caller's, in the track's RTP clock (90 kHz video, 48 kHz Opus),
  relative to the segment's start; video must start with a keyframe. RTP carries
  presentation times only, so decode times are made: without reordering (the
  parameter set declares none, or says nothing) DTS is the PTS; with ``reorder`` R > 0
  (H.264 VUI ``max_num_reorder_frames``, H.265 ``sps_max_num_reorder_pics``, read at the
  segment's keyframe) DTS is the smallest PTS not yet used among the frames so far,
  once R frames are held (the first R frames get DTS just below the first PTS), which
  is monotonic and never after the PTS for any stream that reorders by at most R. A
  stream that reorders more than it declared gets DTS clamped to the previous + 1 and
  its PTS raised to it (those frames show out of order; the linting reports B-frames).
- Stream templates: PyAV adds a stream-copy output stream only from an input stream.
  The video template is the keyframe itself, demuxed from memory (raw H.264/H.265, or a
  one-frame IVF for VP8, VP9 and AV1); the Opus template is a one-packet Ogg file made
  in memory by libopus (only its codec id and layout are used: its extradata is
  replaced with :func:`pipeline.recording.codec_setup.opus_head`, and its packet is
  never written).
- Every PyAV/FFmpeg failure (``av.FFmpegError``) and ``OSError`` propagates to the
  caller, the recorder, which reports it (``recording_failed``); a file that failed is
  closed as far as possible and left on disk.

Threads: a :class:`SegmentFile` is used by one thread, the session's recorder thread.
"""

from __future__ import annotations

import fractions
import heapq
import io
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import av
import numpy as np

from pipeline.recording.codec_setup import ffmpeg_codec, opus_head, video_extradata
from pipeline.stream_profile import read_stream_profile

logger = logging.getLogger(__name__)

VIDEO_CLOCK = fractions.Fraction(1, 90000)
AUDIO_CLOCK = fractions.Fraction(1, 48000)
FRAGMENT_US = 1_000_000
SegmentFormat = Literal["fmp4", "mkv"]
EXTENSIONS: dict[str, str] = {"fmp4": ".mp4", "mkv": ".mkv"}
_IVF_FOURCC = {"vp8": b"VP80", "vp9": b"VP90", "av1": b"AV01"}
_RAW_FORMATS = {"h264": "h264", "hevc": "hevc"}
PROBE_DECODERS = {"av1": "libdav1d"}
"""FFmpeg's own ``av1`` decoder needs a hardware device: dav1d decodes the probe."""


class SetupError(ValueError):
    """A keyframe the muxer cannot be set up from (no size, no parameter sets)."""


@dataclass(frozen=True, slots=True)
class VideoSetup:
    """What one segment's video track is: from the keyframe that opens it."""

    codec: str
    """The RTP encoding name (``H264``)."""
    ffmpeg_codec: str
    width: int
    height: int
    extradata: bytes
    reorder: int = 0
    """Frames the parameter set says may be reordered (0: none or not declared)."""


def probe_video(codec: str, keyframe: bytes) -> VideoSetup:
    """Decode ``keyframe`` once for its size; raise :class:`SetupError` when it cannot
    open a segment (unknown codec, no parameter sets, nothing decoded)."""
    name = ffmpeg_codec(codec)
    if name is None or name == "opus":
        raise SetupError(f"codec {codec!r} is not recordable")
    extradata = video_extradata(codec, keyframe)
    if extradata is None:
        raise SetupError(f"{codec} keyframe without its parameter sets")
    decoder: Any = av.CodecContext.create(PROBE_DECODERS.get(name, name), "r")
    try:
        frames = decoder.decode(av.Packet(keyframe))
        frames += decoder.decode(None)
    except av.FFmpegError as exc:
        raise SetupError(f"{codec} keyframe does not decode: {exc}") from exc
    pictures = [f for f in frames if isinstance(f, av.VideoFrame)]
    if not pictures:
        raise SetupError(f"{codec} keyframe decoded to no picture")
    profile = read_stream_profile(codec, keyframe)
    reorder = profile.reorder if profile is not None and profile.reorder else 0
    return VideoSetup(codec, name, pictures[0].width, pictures[0].height, extradata, reorder)


def _video_template(setup: VideoSetup, keyframe: bytes) -> Any:
    """An input container holding ``keyframe`` as a one-stream file (module doc)."""
    raw = _RAW_FORMATS.get(setup.ffmpeg_codec)
    if raw is not None:
        return av.open(io.BytesIO(keyframe), format=raw)
    header = b"DKIF" + struct.pack(
        "<HH4sHHIIII",
        0,
        32,
        _IVF_FOURCC[setup.ffmpeg_codec],
        setup.width,
        setup.height,
        90000,
        1,
        1,
        0,
    )
    frame = struct.pack("<IQ", len(keyframe), 0) + keyframe
    return av.open(io.BytesIO(header + frame), format="ivf")


def _opus_template() -> Any:
    """A one-packet Ogg Opus file in memory, opened for reading (module doc)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="ogg") as maker:
        stream: Any = maker.add_stream("libopus", rate=48000, layout="stereo")
        silence = av.AudioFrame.from_ndarray(
            np.zeros((1, 1920), dtype=np.int16), format="s16", layout="stereo"
        )
        silence.sample_rate = 48000
        silence.pts = 0
        for packet in [*stream.encode(silence), *stream.encode(None)]:
            maker.mux(packet)
    return av.open(io.BytesIO(buffer.getvalue()))


def _options(fmt: SegmentFormat) -> dict[str, str]:
    if fmt == "fmp4":
        return {
            "movflags": "frag_keyframe+empty_moov+default_base_moof",
            "frag_duration": str(FRAGMENT_US),
            "flush_packets": "1",
        }
    return {"flush_packets": "1"}


class SegmentFile:
    """An open segment (module doc): :meth:`write_video`, :meth:`write_audio`, then
    :meth:`close` (idempotent)."""

    def __init__(
        self,
        path: Path,
        fmt: SegmentFormat,
        *,
        video: VideoSetup | None,
        video_keyframe: bytes | None,
        audio: bool,
    ) -> None:
        """Create ``path`` with a video track set up from ``video`` (its template is
        ``video_keyframe``) and/or an Opus track. Raises ``OSError`` or
        ``av.FFmpegError``; nothing is left open then."""
        self.path = path
        self.video_frames = 0
        self.audio_frames = 0
        self.last_video_ts = 0
        self.last_audio_ts = 0
        self._video_dts: int | None = None
        self._audio_dts = -1
        self._reorder = video.reorder if video is not None else 0
        self._unused_pts: list[int] = []
        """Reordering streams: the PTS not yet given out as a DTS (a min-heap)."""
        self._closed = False
        templates: list[Any] = []
        self._out: Any = av.open(
            str(path), "w", format="mp4" if fmt == "fmp4" else "matroska", options=_options(fmt)
        )
        try:
            self._video: Any = None
            self._audio: Any = None
            if video is not None:
                assert video_keyframe is not None
                templates.append(_video_template(video, video_keyframe))
                # opaque: keep the template's (decoder) codec; no encoder is looked up
                # (there is none named libdav1d), none is ever opened.
                self._video = self._out.add_stream_from_template(
                    templates[-1].streams.video[0], opaque=True
                )
                ctx = self._video.codec_context
                ctx.width, ctx.height = video.width, video.height
                ctx.extradata = video.extradata or None
                self._video.time_base = VIDEO_CLOCK
            if audio:
                templates.append(_opus_template())
                self._audio = self._out.add_stream_from_template(templates[-1].streams.audio[0])
                self._audio.codec_context.extradata = opus_head()
                self._audio.time_base = AUDIO_CLOCK
            self._out.start_encoding()
        except BaseException:
            self._out.close()
            raise
        finally:
            for template in templates:
                template.close()

    @property
    def has_video(self) -> bool:
        return self._video is not None

    @property
    def has_audio(self) -> bool:
        return self._audio is not None

    def write_video(self, data: bytes, ts: int, keyframe: bool) -> None:
        """One video frame at ``ts`` (90 kHz, from the segment's start)."""
        dts = ts
        if self._reorder:
            heapq.heappush(self._unused_pts, ts)
            held = self.video_frames + 1
            if held > self._reorder:
                dts = heapq.heappop(self._unused_pts)
            else:
                dts = -(self._reorder - self.video_frames)  # just below the first PTS
        if self._video_dts is not None and dts <= self._video_dts:
            dts = self._video_dts + 1
        self._video_dts = dts
        self._mux(self._video, data, max(ts, dts), dts, VIDEO_CLOCK, keyframe)
        self.video_frames += 1
        self.last_video_ts = max(self.last_video_ts, ts)

    def write_audio(self, data: bytes, ts: int) -> None:
        """One Opus frame at ``ts`` (48 kHz, from the segment's start)."""
        dts = ts if ts > self._audio_dts else self._audio_dts + 1
        self._audio_dts = dts
        self._mux(self._audio, data, dts, dts, AUDIO_CLOCK, True)
        self.audio_frames += 1
        self.last_audio_ts = max(self.last_audio_ts, ts)

    def _mux(
        self,
        stream: Any,
        data: bytes,
        pts: int,
        dts: int,
        clock: fractions.Fraction,
        keyframe: bool,
    ) -> None:
        packet = av.Packet(data)
        packet.stream = stream
        packet.time_base = clock
        packet.pts = pts
        packet.dts = dts
        packet.is_keyframe = keyframe
        self._out.mux(packet)

    def close(self) -> int:
        """Write the trailer and close; the file's size in bytes. Idempotent (a second
        call only reads the size). Raises ``OSError`` / ``av.FFmpegError`` from the
        trailer; the container is closed either way."""
        if not self._closed:
            self._closed = True
            self._out.close()
        return self.path.stat().st_size

    def abandon(self) -> None:
        """Close after a failure, without raising (what is on disk stays)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._out.close()
        except (OSError, av.FFmpegError) as exc:
            logger.warning("segment %s: close after failure: %s", self.path, exc)
