"""The session manager: the detached session transaction, faults, closing, shutdown.

Session transaction (ARCHITECTURE.md "Flow of one push", step 2), in this order; every
failure path releases exactly what was taken, in reverse:

1. reserve a stream slot for the principal           -> refusal 409
2. reserve the media budget (bytes + threads: :func:`media_need`, a track per decoded
   simulcast layer)                                   -> refusal 503 + Retry-After
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
wins ``remove_if_owned`` moves the session to CLOSING, tells a publisher whose session
the server ends (:data:`SIGNALLED_REASONS`) that its UDP port is gone when the port is
shared (:meth:`whip.rtc.udp_mux.UdpMux.publisher_closing`), closes the peer, stops the
workers (a clean end first drains what already arrived), stops the recorder (its last
segment closes: :mod:`whip.recordings`), writes the closing analyzer events,
``session_closed`` (durable) and releases the permit (or keeps it after a forced
shutdown, ARCHITECTURE.md step 4); every other caller gets ``False``. It runs detached
too, so a DELETE whose client disconnects still finishes. Stop and delete of a run are
:mod:`whip.run_control`'s.

Cluster mode (``timeline`` a :class:`registry.pg.timeline.ClusterTimeline`): step 1
reserves in the store (:class:`whip.cluster_node.ClusterSlots`, exact across nodes; 503
while the store is out of reach or the node is fenced); the rest is unchanged: the
session lives here, its events go to the store.

Seams (:class:`SessionSeams`): the negotiator (and through it the peer-connection
factory) and the id factory are injected, never patched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aioice.ice import Connection

from registry.events import EventType, NewEvent
from registry.histogram import LATENCY_S, Histogram
from registry.timeline import Timeline
from whip.admission import ADMISSION_OUTCOMES, MediaBudget, StreamSlot, StreamSlots
from whip.config import Config
from whip.config.schema import PipelineConfig
from whip.detached import DetachedTasks
from whip.errors import HttpError
from whip.ids import IdFactory, new_id
from whip.live_session import CloseReason, LiveSession, SessionState
from whip.live_stats import ClosedTotals, read_figures
from whip.loop_fairness import LeaseGate, TurnGate
from whip.negotiation import Negotiated, Negotiator
from whip.reclaimer import Reclaimer
from whip.recordings import Recordings
from whip.rtc.ice_sockets import IceSocketProvider, ice_connections, refresh_ice_credentials
from whip.rtc.ice_tcp import IceTcpListener
from whip.rtc.peer import close_quietly
from whip.run_control import RunControl
from whip.sdp import OfferSummary
from whip.sdp.simulcast import decoded_layers, offered_simulcast, simulcast_mode
from whip.session_patch import SessionPatches
from whip.session_pipeline import start_pipeline
from whip.session_table import SessionIdCollisionError, SessionTable
from whip.trickle import new_etag

if TYPE_CHECKING:
    from registry.pg.timeline import ClusterTimeline
    from whip.cluster_node import ClusterSlot, ClusterSlots

logger = logging.getLogger(__name__)

SIGNALLED_REASONS = frozenset(
    {
        CloseReason.STOPPED,
        CloseReason.SUPERSEDED,
        CloseReason.FAULT,
        CloseReason.SHUTDOWN,
        CloseReason.PEER_GONE,
    }
)
"""Closes the server decides while the publisher may still be sending: its UDP port is
reported gone first (module doc). Not the publisher's own DELETE nor its clean end."""

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


def media_need(offer_sdp: str, summary: OfferSummary, pipeline: PipelineConfig) -> tuple[int, int]:
    """(tracks, decode threads) the media budget reserves for one offer: a track per
    accepted section, plus, when ``pipeline.simulcast`` decodes several layers of a
    section, one per further layer; ``workers_per_session`` threads, or a thread per
    track when the layers need more (each intake has its worker)."""
    tracks = len(summary.accepted)
    offers = offered_simulcast(offer_sdp)
    for plan in summary.accepted:
        offer = offers.get(plan.index)
        if offer is not None and plan.kind == "video":
            codec = plan.chosen.encoding if plan.chosen is not None else None
            tracks += decoded_layers(offer, simulcast_mode(pipeline.simulcast, codec)) - 1
    threads = pipeline.workers_per_session
    if tracks > len(summary.accepted):
        threads = max(threads, tracks)
    return tracks, threads


class SessionManager:
    """Owns the session table and every session's lifecycle (module doc)."""

    def __init__(
        self,
        config: Config,
        timeline: Timeline | ClusterTimeline,
        seams: SessionSeams | None = None,
        *,
        ice_sockets: IceSocketProvider | None = None,
        ice_tcp: IceTcpListener | None = None,
    ) -> None:
        """``ice_sockets``: where the negotiated connections gather (the app's shared
        port or per-session sockets); ``None``: aioice's own sockets."""
        seams = seams or SessionSeams()
        self.config = config
        self.timeline = timeline
        limits = config.limits
        self.negotiator = seams.negotiator(config)
        self.negotiator.ice_sockets = ice_sockets
        self.ice_tcp = ice_tcp
        """The ICE-TCP port (``None``: off), given to the negotiator."""
        self.negotiator.ice_tcp = ice_tcp
        self._new_id = seams.new_id
        self.detached = DetachedTasks()
        self.slots: StreamSlots | ClusterSlots
        if isinstance(timeline, Timeline):
            self.slots = StreamSlots(
                limits.stream_limit, timeline.runs.count_active_runs_for_principal
            )
        else:
            from whip.cluster_node import ClusterSlots

            self.slots = ClusterSlots(timeline, limits.stream_limit, self.detached)
        self.budget = MediaBudget(limits.media_budget_bytes, limits.media_budget_threads)
        self.table: SessionTable[LiveSession] = SessionTable(
            limits.max_sessions,
            tombstone_ttl_s=limits.tombstone_ttl_s,
            tombstone_cap=limits.tombstone_capacity,
        )
        self.reclaimer = Reclaimer(
            connect_timeout_s=limits.connect_timeout_s,
            on_connected=self._connected,
            on_gone=self._gone,
            touch_run=timeline.runs.touch if isinstance(timeline, Timeline) else None,
        )
        self.runs = RunControl(timeline, self.detached, self.find_by_run, self.close)
        self.recordings = Recordings(config, timeline if isinstance(timeline, Timeline) else None)
        """Recorders of recorded sessions and the recordings store (:mod:`whip.recordings`)."""
        self.patches = SessionPatches(
            append=self._append_quietly,
            detached=self.detached,
            restart_timeout_s=limits.reclaim_after_s,
            credentials_changed=self._ice_credentials_changed,
        )
        """Trickle ICE and ICE restart PATCHes (:mod:`whip.session_patch`)."""
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
        slot: StreamSlot | ClusterSlot = (
            self.slots.reserve(principal)
            if isinstance(self.slots, StreamSlots)
            else await self.slots.reserve(principal)
        )
        try:
            pipeline = self.config.pipeline
            tracks, threads = media_need(offer_sdp, summary, pipeline)
            record_bytes, record_threads = self.recordings.permit_need(principal)
            permit = self.budget.reserve(
                pipeline.media_bytes(tracks) + record_bytes, threads + record_threads
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
                etag=new_etag(),
                posted_at=posted_at,
                liveness=negotiated.liveness,
                peer_end=negotiated.peer_end,
                answer_sdp=negotiated.answer_sdp,
                intakes=negotiated.intakes,
            )
            codecs = [p.chosen.encoding for p in summary.accepted if p.chosen is not None]
            created = NewEvent(
                run_id,
                EventType.RUN_CREATED,
                principal,
                {"stream": stream, "session_id": session_id, "codecs": codecs},
            )
            if isinstance(slot, StreamSlot):
                await self.timeline.append(created)
            else:  # cluster mode: the commit consumes the store's reservation
                await slot.commit(created)
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
        start_pipeline(
            session,
            negotiated,
            pipeline=self.config.pipeline,
            data_dir=self.config.server.data_dir,
            timeline=self.timeline,
            recordings=self.recordings,
            first_frame_latency=self.first_frame_latency,
            on_fault=self._report_fault,
        )
        logger.info(
            "session %s run %s: admitted for %s stream %r", session_id, run_id, principal, stream
        )
        return Admitted(session, negotiated.answer_sdp)

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
        reject = self.config.server.reconnect == "reject"
        for session in self.table.live():
            if session.principal == principal and session.stream == stream:
                if reject:
                    raise SessionSupersededConflictError(
                        f"stream {stream!r} already has a live session"
                    )
                await self.close(session, CloseReason.SUPERSEDED)
        if not isinstance(self.timeline, Timeline):
            from whip.cluster_node import SUPERSEDE_WAIT_S, supersede_remote

            await supersede_remote(self.timeline, principal, stream, reject, SUPERSEDE_WAIT_S)

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
        """The reclaimer's watch ended: the peer ended cleanly (``peer_closed``), or it
        is gone or never came (``peer_gone``)."""
        clean = session.peer_end is not None and session.peer_end.reason is not None
        reason = CloseReason.PEER_CLOSED if clean else CloseReason.PEER_GONE
        self.detached.detach(self.close(session, reason), f"reclaim-{session.session_id}")

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
        if reason in SIGNALLED_REASONS:
            self._tell_publisher_closed(session)
        await close_quietly(session.pc, f"session {session.session_id}")
        missed: list[str] = []
        if session.supervisor is not None:
            # A clean end decodes what already arrived (bounded); a fault does not wait.
            pipeline = self.config.pipeline
            missed = await session.supervisor.stop_async(
                pipeline.join_deadline_s,
                drain_s=0.0 if reason is CloseReason.FAULT else pipeline.drain_budget_s(),
            )
        if session.recorder is not None:
            # After the workers: no frame arrives any more; its last segment closes now.
            await self.recordings.detach(session.recorder, self.config.pipeline.join_deadline_s)
        after = await read_figures(session)
        if session.analysis is not None and not missed:
            # The workers are joined: the analyzers' state is ours to read now.
            for etype, data in session.analysis.close_episodes():
                await self._append_quietly(session, etype, data)
            final = session.analysis.final_stats()
            # A simulcast video's stats carry its layers (session_emitter); the closing
            # one too, read now that every worker has stopped.
            layers = next((t.layers for t in after.tracks if t.layers is not None), None)
            if layers is not None and final.get("kind", "video") == "video":
                final["layers"] = layers
            await self._append_quietly(session, EventType.STATS, final)
        self.totals.add_closed(media=after, rtp=before)
        if missed:
            self.totals.forced_shutdowns += 1
            # Forced shutdown: the detached threads still hold their memory, so the permit
            # is kept and the run is protected from retention eviction until exit.
            session.permit.keep()
            if isinstance(self.timeline, Timeline):  # the cluster store evicts nothing
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
        self.totals.closed_by_reason[reason.value] += 1
        session.advance(SessionState.CLOSED)
        logger.info(
            "session %s run %s: closed (%s)", session.session_id, session.run_id, reason.value
        )
        return True

    def _tell_publisher_closed(self, session: LiveSession) -> None:
        provider = self.negotiator.ice_sockets
        if provider is None or session.pc is None:
            return
        try:
            connections = ice_connections(session.pc)
        except AttributeError:  # closed before its transports existed: nothing learned
            return
        sent = sum(provider.publisher_closing(connection) for connection in connections)
        if sent:
            logger.debug(
                "session %s run %s: port unreachable sent to the publisher (%d)",
                session.session_id,
                session.run_id,
                sent,
            )

    def _ice_credentials_changed(self, connection: Connection) -> None:
        """An ICE restart gave ``connection`` new local credentials: the shared UDP port
        and the ICE-TCP port route by them, so both learn them now (synchronously, in the
        restart's swap: the publisher's first check with the new ufrag may already be on
        its way)."""
        refresh_ice_credentials(connection)
        if self.ice_tcp is not None:
            self.ice_tcp.register(connection)

    # ------------------------------------------------------------ lookups

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
