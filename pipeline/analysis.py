"""One session's analysis: the analyzers and plug-ins behind a single ``on_frame``.

:class:`Analysis` builds the built-in analyzers (:mod:`pipeline.analyzers`) for a
session and hands :meth:`Analysis.on_frame` to :class:`~pipeline.supervisor.Supervisor`
as its one frame callback. Video frames go to the video analyzers (stats, scene change,
black, thumbnail), audio frames to the audio ones (stats, silence), and every frame to
the configured frame processors (:mod:`pipeline.processor`) that want its kind. Every
event produced goes to ``emit(event_type, data)``, the owner's callable (a non-blocking
timeline append), in the order the analyzers produced it.

Threads: ``on_frame`` runs on the decode worker threads, one per track, so the video and
the audio analyzers each live on one thread and never meet; a processor that takes both
kinds is called under its own lock. ``emit`` is called on those threads too and must
not block for long (it is decode time). :meth:`Analysis.track_rates`,
:meth:`Analysis.final_stats` and :meth:`Analysis.latest_thumbnail` may be called from
any thread, including the event loop (they read counters; no numpy, no I/O).

Failures: an exception from an analyzer, a processor (including invalid output) or
``emit`` propagates out of ``on_frame``: the worker ends with it and the supervisor
reports a fault. Bad media never gets here as an exception (the decoder counts it).

Stats: the *lead* track (video when the session has video, else audio) emits the
periodic ``stats`` events and ``first_frame``; the audio track's figures are nested in
them under ``"audio"``. ``first_frame`` carries the same fields as ``stats`` plus
``ms_since_post``; at the first frame no rate can be measured yet, so its ``fps`` and
``bitrate_bps`` read 0 with ``rate_window_s`` 0.0 (numbers, never null). Each track
emits its own ``stats`` at a codec or format change (``"kind"`` says which).

Linting: the video track has a :class:`~pipeline.stream_lint.StreamLint`; :meth:`Analysis.
watch` makes the video intake feed it every encoded frame with the codec's fmtp. Its
fields (``profile``, ``level``, ``offered_profile``, ``keyframe_interval_s``, ...) join the
video ``stats`` and ``first_frame`` data, and its ``stream_warning`` / ``stream_changed``
events follow the video analyzers' events of the same frame.

Decode policy: with ``decode = "keyframes"`` (``settings.keyframes_only``) the decoder
delivers one frame per GOP; ``fps``, ``bitrate_bps`` and ``keyframes`` still come from
the encoded-frame counters of the intakes (:meth:`Analysis.bind` or
:meth:`Analysis.bind_supervisor`), so they describe the stream, not the decode policy.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import av
from av.video.reformatter import VideoReformatter

from pipeline.analyzers.base import Event, small_luma
from pipeline.analyzers.black import VideoBlack
from pipeline.analyzers.frame_stats import FrameStats, IntakeCounters
from pipeline.analyzers.scene import SceneChange
from pipeline.analyzers.silence import AudioSilence
from pipeline.analyzers.thumbnail import Thumbnailer
from pipeline.decoder import DecodeStats, FrameMeta
from pipeline.frame import Kind
from pipeline.intake import FrameIntake, IntakeStats
from pipeline.processor import FrameProcessor, check_events, processor_kinds, processor_name
from pipeline.stream_lint import LintSettings, StreamLint
from pipeline.supervisor import Supervisor, Worker

logger = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, object]], None]
"""``emit(event_type, data)``: called on a worker thread for every event produced."""


@dataclass(frozen=True, slots=True)
class AnalysisSettings:
    """Analyzer settings (the owner maps ``[pipeline]`` config onto these)."""

    stats_interval_s: float = 5.0
    rate_window_s: float = 2.0
    keyframes_only: bool = False
    scene_threshold: float = 0.4
    scene_min_gap_s: float = 1.0
    thumbnail_interval_s: float = 10.0
    """0: no thumbnails."""
    thumbnail_max_width: int = 640
    thumbnail_quality: int = 5
    black_threshold: float = 0.1
    black_min_s: float = 2.0
    silence_threshold_dbfs: float = -60.0
    silence_min_s: float = 2.0


@dataclass(frozen=True, slots=True)
class _Plugin:
    processor: FrameProcessor
    name: str
    kinds: frozenset[Kind]
    lock: threading.Lock


class Analysis:
    """The analyzers and processors of one session (module doc)."""

    def __init__(
        self,
        emit: Emit,
        *,
        run_id: str,
        settings: AnalysisSettings | None = None,
        kinds: Collection[Kind] = ("video", "audio"),
        processors: Iterable[FrameProcessor] = (),
        thumbnail_dir: Path | None = None,
        posted_at: float | None = None,
    ) -> None:
        """``kinds``: the session's track kinds (the lead track is video unless the
        session is audio-only).
        ``thumbnail_dir``: where ``<run_id>.jpg`` is kept (None: memory only).
        ``posted_at``: ``time.monotonic()`` of the POST; when given, ``first_frame`` is
        emitted at the lead track's first decoded frame with ``ms_since_post``."""
        settings = settings or AnalysisSettings()
        if not set(kinds) <= {"video", "audio"}:
            raise ValueError(f"kinds must be a subset of video, audio: {kinds!r}")
        self._emit = emit
        self.run_id = run_id
        self.settings = settings
        self.kinds: frozenset[Kind] = frozenset(kinds)
        self.lead: Kind = "audio" if self.kinds == {"audio"} else "video"
        self.posted_at = posted_at
        self.video_stats = self._frame_stats("video")
        self.audio_stats = self._frame_stats("audio")
        self._reformatter = VideoReformatter()  # small_luma's, for formats the C skips
        self.scene = SceneChange(settings.scene_threshold, settings.scene_min_gap_s)
        self.black = VideoBlack(settings.black_threshold, settings.black_min_s)
        self.thumbnailer = Thumbnailer(
            thumbnail_dir,
            run_id,
            interval_s=settings.thumbnail_interval_s,
            max_width=settings.thumbnail_max_width,
            quality=settings.thumbnail_quality,
        )
        self.silence = AudioSilence(settings.silence_threshold_dbfs, settings.silence_min_s)
        self.lint = StreamLint(
            LintSettings(rate_window_s=settings.rate_window_s), label=f"run {run_id} video"
        )
        self._plugins = tuple(
            _Plugin(p, processor_name(p), processor_kinds(p), threading.Lock()) for p in processors
        )
        self._first_frame_sent = False
        logger.debug(
            "analysis %s: tracks %s (lead %s), processors %s",
            run_id,
            ", ".join(sorted(self.kinds)) or "none",
            self.lead,
            ", ".join(p.name for p in self._plugins) or "none",
        )

    def _frame_stats(self, kind: Kind) -> FrameStats:
        lead = kind == self.lead
        nest = lead and kind == "video" and "audio" in self.kinds
        return FrameStats(
            kind,
            interval_s=self.settings.stats_interval_s if lead else None,
            window_s=self.settings.rate_window_s,
            keyframes_only=self.settings.keyframes_only,
            extra=self._audio_extra if nest else None,
        )

    # ------------------------------------------------------------ wiring

    def bind(
        self,
        kind: Kind,
        *,
        intake_stats: Callable[[], IntakeStats | None] | None = None,
        decode_stats: Callable[[], DecodeStats | None] | None = None,
        intake_counters: IntakeCounters | None = None,
    ) -> None:
        """Give the ``kind`` track's stats their encoded-frame and decode counters
        (``intake_counters``: the per-frame ``(frames_in, bytes_in)`` reading, see
        :class:`~pipeline.analyzers.frame_stats.FrameStats`).

        Call before frames flow (the callables are read on the worker threads after).
        """
        stats = self.video_stats if kind == "video" else self.audio_stats
        stats.bind(
            intake_stats=intake_stats, decode_stats=decode_stats, intake_counters=intake_counters
        )

    def watch(self, intakes: Iterable[FrameIntake]) -> None:
        """Have the first video intake among ``intakes`` feed the linting (module doc).
        Only one: the linting's order and keyframe checks hold within one stream, and
        frames of two (simulcast layers) interleaved would read as reordering. Call
        before frames flow."""
        video = next((intake for intake in intakes if intake.kind == "video"), None)
        if video is not None:
            video.set_observer(self.lint.observe)

    def bind_supervisor(self, supervisor: Supervisor) -> None:
        """:meth:`bind` every kind to ``supervisor``'s workers (first worker of each kind).

        Lazy: call it right after constructing the supervisor, before or after ``start``;
        the workers are looked up when stats are read.
        """

        for kind in self.kinds:
            self.bind(
                kind,
                intake_stats=functools.partial(_intake_stats_of, supervisor, kind),
                decode_stats=functools.partial(_decode_stats_of, supervisor, kind),
                intake_counters=functools.partial(_intake_counters_of, supervisor, kind),
            )

    # ------------------------------------------------------------ worker threads

    def on_frame(self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta) -> None:
        """The :class:`~pipeline.supervisor.Supervisor` frame callback (module doc)."""
        if isinstance(frame, av.VideoFrame):
            events = self._video(frame, meta)
        else:
            events = self._audio(frame, meta)
        for plugin in self._plugins:
            if meta.kind in plugin.kinds:
                with plugin.lock:
                    events += check_events(plugin.processor.process(frame, meta), plugin.name)
        for etype, data in events:
            self._emit(etype, data)

    def _video(self, frame: av.VideoFrame, meta: FrameMeta) -> list[Event]:
        events = self.video_stats.process(frame, meta)
        for etype, data in events:
            if etype == "stats":
                data.update(self.lint.fields())
        if self.lead == "video":
            self._first_frame(meta, events)
        luma = small_luma(frame, self._reformatter)  # once, for both (its doc)
        events += self.scene.process_luma(luma, meta)
        events += self.black.process_luma(luma, meta)
        events += self.thumbnailer.process(frame, meta)
        fps, _bitrate, span = self.video_stats.fps_and_bitrate()
        events += self.lint.process(frame, meta, fps, span)
        return events

    def _audio(self, frame: av.AudioFrame, meta: FrameMeta) -> list[Event]:
        events = self.audio_stats.process(frame, meta)
        if self.lead == "audio":
            self._first_frame(meta, events)
        events += self.silence.process(frame, meta)
        return events

    def _first_frame(self, meta: FrameMeta, events: list[Event]) -> None:
        if self._first_frame_sent or self.posted_at is None:
            return
        self._first_frame_sent = True
        data = self._lead_stats().snapshot()
        if self.lead == "video":
            data.update(self.lint.fields())
        data["ms_since_post"] = int((meta.decoded_at - self.posted_at) * 1000)
        events.insert(0, ("first_frame", data))

    def _lead_stats(self) -> FrameStats:
        return self.video_stats if self.lead == "video" else self.audio_stats

    def _audio_extra(self) -> dict[str, object]:
        audio = self.audio_stats.snapshot()
        audio["level_dbfs"] = round(self.silence.level_dbfs, 1)
        return {"audio": audio}

    # ------------------------------------------------------------ any thread

    def track_rates(self, kind: Kind) -> tuple[float, int, float]:
        """The ``kind`` track's :meth:`FrameStats.fps_and_bitrate` (any thread)."""
        stats = self.video_stats if kind == "video" else self.audio_stats
        return stats.fps_and_bitrate()

    def final_stats(self) -> dict[str, object]:
        """The closing ``stats`` event's data: :meth:`FrameStats.final` of the lead
        track (whole-run averages and totals), the audio track's nested under
        ``"audio"``, ``scene_changes`` and ``thumbnails`` (video), ``"final": True``."""
        data = self._lead_stats().final()
        if self.lead == "video":
            data.update(self.lint.fields())
            if "audio" in self.kinds:
                audio = self.audio_stats.final()
                audio["level_dbfs"] = round(self.silence.level_dbfs, 1)
                data["audio"] = audio
            data["scene_changes"] = self.scene.events
            data["thumbnails"] = self.thumbnailer.encoded
        data["final"] = True
        return data

    def latest_thumbnail(self) -> bytes | None:
        """The newest JPEG thumbnail of the video track, or None."""
        return self.thumbnailer.latest()

    def close_episodes(self) -> list[Event]:
        """``end`` events for a black or silence episode still open at the end of the
        stream (``"reason": "stream_end"``), for the owner to emit before the final
        stats. Call only once every worker has exited (their analyzer state is not
        locked); after a forced shutdown, skip it."""
        return self.black.close() + self.silence.close()


def _worker_of(supervisor: Supervisor, kind: Kind) -> Worker | None:
    for worker in supervisor.workers:
        if worker.intake.kind == kind:
            return worker
    return None


def _intake_stats_of(supervisor: Supervisor, kind: Kind) -> IntakeStats | None:
    worker = _worker_of(supervisor, kind)
    return worker.intake.stats() if worker is not None else None


def _intake_counters_of(supervisor: Supervisor, kind: Kind) -> tuple[int, int] | None:
    worker = _worker_of(supervisor, kind)
    if worker is None:
        return None
    intake = worker.intake
    return intake.frames_in, intake.bytes_in


def _decode_stats_of(supervisor: Supervisor, kind: Kind) -> DecodeStats | None:
    worker = _worker_of(supervisor, kind)
    return worker.stats if worker is not None else None
