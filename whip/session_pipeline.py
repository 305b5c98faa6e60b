"""A session's media pipeline, started: analyzers, decode workers, recorder, event sink.

Rules:

- :func:`start_pipeline` runs on the event loop with no ``await``: the session manager
  calls it right after the reclaimer starts (:mod:`whip.session_manager`, step 5), so a
  visible session always has its media owner too.
- Every failure to start (a processor that does not load, a thread that will not start)
  is the session's fault, reported through ``on_fault`` with the stage ``"start"``; tap
  failures are routed to ``on_fault`` (stage ``"intake"``) whatever happened.
- The worker threads' events go through :func:`session_emitter`: a non-blocking append. A
  full WAL queue drops that one event (logged) rather than stall decoding; lifecycle
  events never go this way.
- The decode workers get the threads of the session's media permit that its recorder
  does not take.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pipeline.analysis import Analysis, AnalysisSettings, Emit
from pipeline.processor import load_processor
from pipeline.supervisor import Supervisor
from registry.errors import RegistryError
from registry.events import EventType, NewEvent
from registry.histogram import Histogram
from registry.timeline import Timeline
from whip.config.schema import PipelineConfig
from whip.live_session import LiveSession
from whip.negotiation import Negotiated
from whip.recordings import Recordings
from whip.rtc.simulcast import SimulcastDemux

if TYPE_CHECKING:
    from pathlib import Path

    from registry.pg.timeline import ClusterTimeline

logger = logging.getLogger(__name__)

OnFault = Callable[[LiveSession, str, BaseException], None]
"""``(session, stage, exc)``: the session manager's fault report."""


def start_pipeline(
    session: LiveSession,
    negotiated: Negotiated,
    *,
    pipeline: PipelineConfig,
    data_dir: Path,
    timeline: Timeline | ClusterTimeline,
    recordings: Recordings,
    first_frame_latency: Histogram,
    on_fault: OnFault,
) -> None:
    """Start the analyzers, the recorder (when the principal records) and the decode
    workers of ``session`` (module rules)."""
    try:
        processors = [load_processor(spec) for spec in pipeline.processors]
        emit = session_emitter(session, timeline, first_frame_latency, negotiated.simulcast)
        for demux in negotiated.simulcast:
            demux.on_change = lambda change, data: emit(
                EventType.SIMULCAST_LAYER, {"change": change, **data}
            )
        analysis = Analysis(
            emit,
            run_id=session.run_id,
            settings=AnalysisSettings(
                stats_interval_s=pipeline.stats_interval_s,
                scene_threshold=pipeline.scene_threshold,
                thumbnail_interval_s=pipeline.thumbnail_interval_s,
                keyframes_only=pipeline.decode == "keyframes",
            ),
            kinds=[intake.kind for intake in session.intakes],
            processors=processors,
            thumbnail_dir=data_dir / "thumbnails",
            posted_at=session.posted_at,
        )
        session.analysis = analysis
        analysis.watch(session.intakes)
        session.supervisor = Supervisor(
            session.session_id,
            loop=asyncio.get_running_loop(),
            on_fault=lambda stage, exc: on_fault(session, stage, exc),
            on_frame=analysis.on_frame,
            codec_threads=pipeline.codec_threads,
            keyframes_only=pipeline.decode == "keyframes",
            max_pixels=pipeline.max_pixels,
            max_workers=session.permit.threads - recordings.permit_need(session.principal)[1],
        )
        analysis.bind_supervisor(session.supervisor)
        if recordings.records(session.principal):
            session.recorder = recordings.attach(
                session.run_id,
                session.session_id,
                session.intakes,
                emit,
                asyncio.get_running_loop(),
                receivers=negotiated.receivers,
            )
        session.supervisor.start(session.intakes)
    except Exception as exc:  # a processor that does not load, a thread that won't start
        on_fault(session, "start", exc)
        return
    finally:
        negotiated.tap_faults.route_to(lambda exc: on_fault(session, "intake", exc))


def session_emitter(
    session: LiveSession,
    timeline: Timeline | ClusterTimeline,
    first_frame_latency: Histogram,
    simulcast: Sequence[SimulcastDemux] = (),
) -> Emit:
    """Worker-thread sink of ``session``'s analyzer events (module rules). A video
    ``stats`` event of a simulcast session gains ``layers``
    (:meth:`whip.rtc.simulcast.SimulcastDemux.figures`); ``first_frame`` feeds the
    POST-to-first-frame histogram."""

    def emit(etype: str, data: dict[str, object]) -> None:
        if simulcast and etype == EventType.STATS and data.get("kind", "video") == "video":
            data = {**data, "layers": simulcast[0].figures()}
        if etype == EventType.FIRST_FRAME:
            since_post = data.get("ms_since_post")
            if isinstance(since_post, int | float):
                first_frame_latency.observe(since_post / 1000)
        try:
            timeline.append_nowait(NewEvent(session.run_id, etype, session.principal, data))
        except RegistryError as exc:
            logger.warning(
                "session %s run %s: %s not recorded: %s",
                session.session_id,
                session.run_id,
                etype,
                exc,
            )

    return emit
