"""The session manager: the detached session transaction, faults, closing, shutdown.

Session transaction (ARCHITECTURE.md "Flow of one push", step 2), in this order; every
failure path releases exactly what was taken, in reverse:

1. reserve a stream slot for the principal           -> refusal 409
2. reserve the media budget (bytes + threads)        -> refusal 503 + Retry-After
   negotiate (:mod:`whip.negotiation`: peer connection, remote offer, taps, answer),
   behind the negotiation gate
3. append ``run_created`` durably                    -> failure 500
4. insert into the session table (exact cap)         -> failure: tombstone the run
   (``run_deleted``, retried in the background until durable), 503
5. start the reclaimer (:mod:`whip.reclaimer`) and the decode workers; no ``await``
   between 4 and 5, so a visible session always has an owner.

Negotiation gate: at most ``limits.negotiation_concurrency`` negotiations run at once
(:class:`whip.loop_fairness.LeaseGate`); the others wait holding their stream slot and
media permit (refusals at steps 1-2 never wait). A negotiation keeps its place for at
most :data:`NEGOTIATION_LEASE_S`: one that takes longer is waiting, not computing (an
mDNS candidate is resolved inside ``setRemoteDescription``), and lets the next start.
Why the gate exists (a burst of negotiations stalls the loop) is measured in
``docs/PERFORMANCE.md``.

The transaction runs as a detached task (:mod:`whip.detached`): a client that hangs up
cancels only its wait, never a half-done step. What the transaction built is then either
answered or, if nobody connects, reclaimed by the reclaimer's connect deadline.

Closing: :meth:`SessionManager.close` is the one way a session ends. The caller that
wins ``remove_if_owned`` moves the session to CLOSING, closes the peer, stops the
workers (a clean end first drains what already arrived), writes the closing analyzer
events, ``session_closed`` (durable) and releases the permit (or keeps it after a forced
shutdown, ARCHITECTURE.md step 4); every other caller gets ``False``. It runs detached too,
so a DELETE whose client disconnects still finishes. Stop and delete of a run are
:mod:`whip.run_control`'s.

Seams (:class:`SessionSeams`): the negotiator (and through it the peer-connection
factory) and the id factory are injected, never patched.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiortc.sdp import candidate_from_sdp

from pipeline.analysis import Analysis, AnalysisSettings, Emit
from pipeline.processor import load_processor
from pipeline.supervisor import Supervisor
from registry.errors import RegistryError
from registry.events import EventType, NewEvent
from registry.histogram import LATENCY_S, Histogram
from registry.timeline import Timeline
from whip.admission import ADMISSION_OUTCOMES, MediaBudget, StreamSlots
from whip.config import Config
from whip.detached import DetachedTasks
from whip.errors import HttpError
from whip.ids import IdFactory, new_id
from whip.live_session import CloseReason, LiveSession, SessionState
from whip.live_stats import ClosedTotals, read_figures
from whip.loop_fairness import LeaseGate, TurnGate
from whip.negotiation import Negotiated, Negotiator
from whip.reclaimer import Reclaimer
from whip.rtc.peer import close_quietly
from whip.run_control import RunControl
from whip.sdp import OfferSummary
from whip.session_table import SessionIdCollisionError, SessionTable
from whip.trickle import FragmentError, TrickleFragment, check_not_restart, remote_ufrag

logger = logging.getLogger(__name__)

TOMBSTONE_RETRIES = 3
NEGOTIATION_LEASE_S = 0.25
"""A negotiation holds its place in the gate this long at most (module doc)."""
SHUTDOWN_PASSES = 3
SHUTDOWN_WAIT_S = 10.0


class SessionSupersededConflictError(HttpError):
    """``reconnect = "reject"`` and the stream already has a live session."""

    http_status = 409
    code = "stream_busy"


class ShuttingDownError(HttpError):
    """The server is shutting down: no new session."""

    http_status = 503
    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__("server is shutting down", headers={"Retry-After": "5"})


@dataclass(frozen=True, slots=True)
class SessionSeams:
    """What a caller (a test) may inject instead of the production parts."""

    negotiator: Callable[[Config], Negotiator] = Negotiator
    """Makes the negotiator (its ``peer_factory`` makes the peer connections)."""
    new_id: IdFactory = new_id


@dataclass(frozen=True, slots=True)
class Admitted:
    """What the 201 answer needs."""

    session: LiveSession
    answer_sdp: str


class SessionManager:
    """Owns the session table and every session's lifecycle (module doc)."""

    def __init__(
        self, config: Config, timeline: Timeline, seams: SessionSeams | None = None
    ) -> None:
        seams = seams or SessionSeams()
        self.config = config
        self.timeline = timeline
        limits = config.limits
        self.negotiator = seams.negotiator(config)
        self._new_id = seams.new_id
        self.slots = StreamSlots(limits.stream_limit, timeline.runs.count_active_runs_for_principal)
        self.budget = MediaBudget(limits.media_budget_bytes, limits.media_budget_threads)
        self.table: SessionTable[LiveSession] = SessionTable(
            limits.max_sessions,
            tombstone_ttl_s=limits.tombstone_ttl_s,
            tombstone_cap=limits.tombstone_capacity,
        )
        self.detached = DetachedTasks()
        self.reclaimer = Reclaimer(
            connect_timeout_s=limits.connect_timeout_s,
            on_connected=self._connected,
            on_gone=self._gone,
            touch_run=timeline.runs.touch,
        )
        self.runs = RunControl(timeline, self.detached, self.find_by_run, self.close)
        """Stop and delete of runs (:mod:`whip.run_control`)."""
        self.check_turns = TurnGate(limits.sdp_checks_per_turn)
        """Turns for the SDP checks of ``POST /whip`` (:mod:`whip.loop_fairness`)."""
        self.negotiation_gate = LeaseGate(limits.negotiation_concurrency, NEGOTIATION_LEASE_S)
        """Bounds the negotiations running at once (module doc)."""
        self._shutting_down = False
        self.admissions: dict[str, int] = dict.fromkeys(ADMISSION_OUTCOMES, 0)
        """WHIP POSTs by outcome (loop thread only)."""
        self.totals = ClosedTotals()
        """Counters of closed sessions (live ones are added at scrape time)."""
        self.post_latency = Histogram(LATENCY_S)
        self.first_frame_latency = Histogram(LATENCY_S)

    # ------------------------------------------------------------ the transaction

    async def admit(
        self, principal: str, stream: str, offer_sdp: str, summary: OfferSummary, posted_at: float
    ) -> Admitted:
        """The session transaction (module doc), detached from the request.

        Cancellation: the caller stops waiting; the transaction runs to its end."""
        return await self.detached.run(
            self._transaction(principal, stream, offer_sdp, summary, posted_at), "whip-admit"
        )

    def _refuse_if_shutting_down(self) -> None:
        if self._shutting_down:
            raise ShuttingDownError()

    async def _transaction(
        self, principal: str, stream: str, offer_sdp: str, summary: OfferSummary, posted_at: float
    ) -> Admitted:
        self._refuse_if_shutting_down()
        await self._supersede(principal, stream)
        slot = self.slots.reserve(principal)
        try:
            pipeline = self.config.pipeline
            permit = self.budget.reserve(
                pipeline.media_bytes(len(summary.accepted)), pipeline.workers_per_session
            )
        except BaseException:
            slot.release()
            raise
        negotiated: Negotiated | None = None
        try:
            session_id = self._new_id("s_")
            run_id = self._new_id("r_")
            async with self.negotiation_gate.lease():
                negotiated = await self.negotiator.negotiate(offer_sdp, summary, session_id)
            session = LiveSession(
                session_id=session_id,
                run_id=run_id,
                principal=principal,
                stream=stream,
                pc=negotiated.pc,
                permit=permit,
                etag=f'"{secrets.token_hex(8)}"',
                posted_at=posted_at,
                liveness=negotiated.liveness,
                intakes=negotiated.intakes,
            )
            codecs = [p.chosen.encoding for p in summary.accepted if p.chosen is not None]
            await self.timeline.append(
                NewEvent(
                    run_id,
                    EventType.RUN_CREATED,
                    principal,
                    {"stream": stream, "session_id": session_id, "codecs": codecs},
                )
            )
        except BaseException:
            if negotiated is not None:
                await close_quietly(negotiated.pc, "admission failed")
            permit.release()
            slot.release()
            raise
        slot.release()  # the durable run now counts as committed
        try:
            self._refuse_if_shutting_down()
            self.table.insert(session_id, session)
        except (HttpError, SessionIdCollisionError) as exc:
            self.detached.detach(self._tombstone_run(run_id, principal), f"tombstone-{run_id}")
            await close_quietly(session.pc, f"run {run_id}: insert refused")
            permit.release()
            if isinstance(exc, HttpError):
                raise
            raise HttpError(
                "session id collision; retry",
                http_status=503,
                code="session_cap",
                headers={"Retry-After": "1"},
            ) from exc
        # No await between insertion and the reclaimer: a visible session has an owner.
        self.reclaimer.start(session)
        self._start_pipeline(session, negotiated)
        logger.info(
            "session %s run %s: admitted for %s stream %r", session_id, run_id, principal, stream
        )
        return Admitted(session, negotiated.answer_sdp)

    def _start_pipeline(self, session: LiveSession, negotiated: Negotiated) -> None:
        """Start the analyzers and decode workers, then route tap failures to the
        session's faults (no await: called right after the reclaimer starts, so a
        visible session always has its media owner too)."""
        pipeline = self.config.pipeline
        try:
            processors = [load_processor(spec) for spec in pipeline.processors]
            analysis = Analysis(
                self._emitter(session),
                run_id=session.run_id,
                settings=AnalysisSettings(
                    stats_interval_s=pipeline.stats_interval_s,
                    scene_threshold=pipeline.scene_threshold,
                    thumbnail_interval_s=pipeline.thumbnail_interval_s,
                    keyframes_only=pipeline.decode == "keyframes",
                ),
                kinds=[intake.kind for intake in session.intakes],
                processors=processors,
                thumbnail_dir=self.config.server.data_dir / "thumbnails",
                posted_at=session.posted_at,
            )
            session.analysis = analysis
            session.supervisor = Supervisor(
                session.session_id,
                loop=asyncio.get_running_loop(),
                on_fault=lambda stage, exc: self._report_fault(session, stage, exc),
                on_frame=analysis.on_frame,
                codec_threads=pipeline.codec_threads,
                keyframes_only=pipeline.decode == "keyframes",
                max_pixels=pipeline.max_pixels,
                max_workers=session.permit.threads,
            )
            analysis.bind_supervisor(session.supervisor)
            session.supervisor.start(session.intakes)
        except Exception as exc:  # a processor that does not load, a thread that won't start
            self._report_fault(session, "start", exc)
            return
        finally:
            negotiated.tap_faults.route_to(lambda exc: self._report_fault(session, "intake", exc))

    def _emitter(self, session: LiveSession) -> Emit:
        """Worker-thread sink of analyzer events: a non-blocking append. A full WAL queue
        drops that one event (logged) rather than stall decoding; lifecycle events never
        go this way."""

        def emit(etype: str, data: dict[str, object]) -> None:
            if etype == EventType.FIRST_FRAME:
                since_post = data.get("ms_since_post")
                if isinstance(since_post, int | float):
                    self.first_frame_latency.observe(since_post / 1000)
            try:
                self.timeline.append_nowait(
                    NewEvent(session.run_id, etype, session.principal, data)
                )
            except RegistryError as exc:
                logger.warning(
                    "session %s run %s: %s not recorded: %s",
                    session.session_id,
                    session.run_id,
                    etype,
                    exc,
                )

        return emit

    async def _tombstone_run(self, run_id: str, principal: str) -> None:
        """Write ``run_deleted`` for a run whose session never became visible."""
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.timeline.delete_run(run_id, principal, {"reason": "admission_failed"})
                return
            except Exception as exc:
                logger.warning("run %s: tombstone attempt %d failed: %s", run_id, attempt, exc)
                if not self.timeline.ready:
                    return
            await asyncio.sleep(delay if attempt < TOMBSTONE_RETRIES else 5.0)
            delay *= 2

    async def _supersede(self, principal: str, stream: str) -> None:
        """A new push to a named stream ends the principal's live session on it
        (``server.reconnect = "supersede"``) or is refused (``"reject"``)."""
        if not stream:
            return
        for session in self.table.live():
            if session.principal == principal and session.stream == stream:
                if self.config.server.reconnect == "reject":
                    raise SessionSupersededConflictError(
                        f"stream {stream!r} already has a live session"
                    )
                await self.close(session, CloseReason.SUPERSEDED)

    # ------------------------------------------------------------ faults and the reclaimer

    def _report_fault(self, session: LiveSession, stage: str, exc: BaseException) -> None:
        """Loop thread: a worker or tap failed; record it durably, then close (fault)."""
        if session.closing:
            return
        logger.error(
            "session %s run %s: %s worker fault: %r", session.session_id, session.run_id, stage, exc
        )
        self.detached.detach(self._fault(session, stage, exc), f"fault-{session.session_id}")

    async def _fault(self, session: LiveSession, stage: str, exc: BaseException) -> None:
        self.totals.worker_faults += 1
        await self._append_quietly(
            session, EventType.WORKER_FAULT, {"stage": stage, "error": repr(exc)[:500]}
        )
        await self.close(session, CloseReason.FAULT)

    async def _connected(self, session: LiveSession) -> None:
        """The reclaimer saw the peer connect."""
        waited_ms = int((time.monotonic() - session.posted_at) * 1000)
        await self._append_quietly(
            session, EventType.SESSION_CONNECTED, {"ms_since_post": waited_ms}
        )

    def _gone(self, session: LiveSession) -> None:
        """The reclaimer's watch ended: the peer is gone (or never came)."""
        self.detached.detach(
            self.close(session, CloseReason.PEER_GONE), f"reclaim-{session.session_id}"
        )

    async def _append_quietly(
        self, session: LiveSession, etype: str, data: dict[str, object]
    ) -> None:
        try:
            await self.timeline.append(NewEvent(session.run_id, etype, session.principal, data))
        except Exception as exc:
            logger.error(
                "session %s run %s: cannot append %s: %s",
                session.session_id,
                session.run_id,
                etype,
                exc,
            )

    # ------------------------------------------------------------ closing

    async def close(self, session: LiveSession, reason: CloseReason) -> bool:
        """End ``session`` if we win its removal; True for the one winner.

        Cancellation: detached; a cancelled caller does not stop the close half-way.
        """
        if not self.table.remove_if_owned(session.session_id, session, session.run_id, reason):
            return False
        session.advance(SessionState.CLOSING)
        return await self.detached.run(self._finish(session, reason), f"close-{session.session_id}")

    async def _finish(self, session: LiveSession, reason: CloseReason) -> bool:
        current = asyncio.current_task()
        if session.reclaimer is not None and session.reclaimer is not current:
            session.reclaimer.cancel()
        before = await read_figures(session)  # RTP statistics die with the peer
        await close_quietly(session.pc, f"session {session.session_id}")
        missed: list[str] = []
        if session.supervisor is not None:
            # A clean end decodes what already arrived (bounded); a fault does not wait.
            pipeline = self.config.pipeline
            missed = await session.supervisor.stop_async(
                pipeline.join_deadline_s,
                drain_s=0.0 if reason is CloseReason.FAULT else pipeline.drain_budget_s(),
            )
        after = await read_figures(session)
        if session.analysis is not None and not missed:
            # The workers are joined: the analyzers' state is ours to read now.
            for etype, data in session.analysis.close_episodes():
                await self._append_quietly(session, etype, data)
            await self._append_quietly(session, EventType.STATS, session.analysis.final_stats())
        self.totals.add_closed(media=after, rtp=before)
        if missed:
            self.totals.forced_shutdowns += 1
            # Forced shutdown: the detached threads still hold their memory, so the permit
            # is kept and the run is protected from retention eviction until exit.
            session.permit.keep()
            self.timeline.runs.pin(session.run_id)
            await self._append_quietly(
                session,
                EventType.FORCED_SHUTDOWN,
                {
                    "threads": missed,
                    "kept_bytes": session.permit.nbytes,
                    "kept_threads": session.permit.threads,
                },
            )
        else:
            session.permit.release()
        await self._append_quietly(session, EventType.SESSION_CLOSED, {"reason": reason.value})
        session.advance(SessionState.CLOSED)
        logger.info(
            "session %s run %s: closed (%s)", session.session_id, session.run_id, reason.value
        )
        return True

    # ------------------------------------------------------------ trickle, lookups

    async def trickle(self, session: LiveSession, fragment: TrickleFragment) -> None:
        """Apply trickled candidates (an ICE restart is refused with 422).

        Every line is parsed before any is applied; candidates go to the bundle
        transport (the first transceiver), which is where aiortc gathers for BUNDLE.
        """
        pc = session.pc
        check_not_restart(fragment, remote_ufrag(pc.remoteDescription.sdp))
        transceivers = pc.getTransceivers()
        if not transceivers:
            raise HttpError("session has no media", http_status=409, code="no_media")
        mid = transceivers[0].mid
        parsed = []
        for line in fragment.candidates:
            try:
                candidate = candidate_from_sdp(line.removeprefix("candidate:"))
            except (ValueError, IndexError) as exc:
                raise FragmentError(f"malformed candidate: {exc}") from exc
            candidate.sdpMid = mid
            parsed.append(candidate)
        for candidate in parsed:
            await pc.addIceCandidate(candidate)
        if fragment.end_of_candidates:
            await pc.addIceCandidate(None)

    def find_by_run(self, run_id: str) -> LiveSession | None:
        """The live session of ``run_id``, if any."""
        for session in self.table.live():
            if session.run_id == run_id:
                return session
        return None

    # ------------------------------------------------------------ shutdown

    async def shutdown(self) -> None:
        """Refuse new sessions, close every live one (reason ``shutdown``), wait for
        detached work. Sessions whose admission finishes during the wait are closed by
        the next pass (bounded: :data:`SHUTDOWN_PASSES`). The errors of the closes are
        collected and logged, one line each, never raised over the others.

        Cancellation: the closes already started run on (detached)."""
        self._shutting_down = True
        for _ in range(SHUTDOWN_PASSES):
            sessions = self.table.live()
            results = await asyncio.gather(
                *(self.close(s, CloseReason.SHUTDOWN) for s in sessions), return_exceptions=True
            )
            for session, result in zip(sessions, results, strict=True):
                if isinstance(result, BaseException):
                    logger.error(
                        "shutdown: session %s run %s: close failed: %r",
                        session.session_id,
                        session.run_id,
                        result,
                    )
            await self.detached.wait(SHUTDOWN_WAIT_S)
            if not self.table.live():
                return
        logger.error("shutdown: %d sessions still live after three passes", len(self.table))
