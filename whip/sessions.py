"""The session manager: the detached session transaction, the reclaimer, closing.

Session transaction (ARCHITECTURE.md "Flow of one push", step 2), in this order; every
failure path releases exactly what was taken, in reverse:

1. reserve a stream slot for the principal           -> refusal 409
2. reserve the media budget (bytes + threads)        -> refusal 503 + Retry-After
   negotiate: peer connection, remote offer, answer (ICE gathering), behind the
   negotiation gate
3. append ``run_created`` durably                    -> failure 500
4. insert into the session table (exact cap)         -> failure: tombstone the run
   (``run_deleted``, retried in the background until durable), 503
5. start the reclaimer; no ``await`` between 4 and 5, so a visible session always has
   an owner.

Negotiation gate: at most ``limits.negotiation_concurrency`` negotiations run at once
(:class:`whip.turns.LeaseGate`); the others wait holding their stream slot and media
permit (refusals at steps 1-2 never wait). A negotiation costs the loop ~2.5 ms in three
steps, the first (peer connection, parsing the offer, transceivers) ~1.3 ms; a burst
that negotiated 150 offers at once made iterations of 100 ms and more, during which no
other request (``/healthz``) was served. A negotiation keeps its place for at most
:data:`NEGOTIATION_LEASE_S`: one that takes longer is waiting, not computing (an mDNS
candidate is resolved inside ``setRemoteDescription``, up to 1 s), and lets the next
start. The order of the steps is unchanged.

The transaction runs as its own task: a client that hangs up cancels only its wait, never
a half-done step. What the transaction built is then either answered or, if nobody
connects, reclaimed by the reclaimer's connect deadline.

Closing: :meth:`SessionManager.close` is the one way a session ends. The caller that
wins ``remove_if_owned`` closes the peer, writes ``session_closed`` (durable) and
releases the permit; every other caller gets ``False``. It also runs detached, so a
DELETE whose client disconnects still finishes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import OperationError
from aiortc.sdp import candidate_from_sdp

from pipeline.analysis import Analysis, AnalysisSettings, Emit
from pipeline.errors import PipelineError
from pipeline.intake import FrameIntake
from pipeline.processor import load_processor
from pipeline.supervisor import Supervisor
from registry.deletion import DeleteResult
from registry.errors import RegistryError
from registry.events import EventType, NewEvent
from registry.histogram import LATENCY_S, Histogram
from registry.timeline import Timeline
from whip.admission import MediaBudget, StreamSlots
from whip.config import Config
from whip.errors import HttpError
from whip.rtc.certificate import use_wide_certificate
from whip.rtc.dtls_kick import install_dtls_kick
from whip.rtc.liveness import Liveness, install_media_liveness
from whip.rtc.pli import schedule_pli
from whip.rtc.rtp_guard import RtpGuard
from whip.rtc.tap import install_tap
from whip.rtc.transceiver_codecs import restrict_codecs
from whip.sdp import OfferSummary, UnprocessableOfferError, finalize_answer
from whip.session import CloseReason, WhipSession
from whip.session_stats import session_stats
from whip.session_table import SessionIdCollisionError, SessionTable
from whip.trickle import FragmentError, TrickleFragment, check_not_restart, remote_ufrag
from whip.turns import LeaseGate, TurnGate

logger = logging.getLogger(__name__)

T = TypeVar("T")

ACTIVITY_TOUCH_S = 5.0
"""While connected, the reclaimer records the run's activity this often (media flowing)."""
TOMBSTONE_RETRIES = 3
NEGOTIATION_LEASE_S = 0.25
"""A negotiation holds its place in the gate this long at most (module doc)."""

ADMISSION_OUTCOMES = (
    "accepted",
    "stream_limit",
    "budget",
    "session_cap",
    "bad_request",
    "unauthorized",
    "error",
)
"""``whip_admissions_total{outcome}`` label values."""

_OUTCOME_BY_CODE = {
    "stream_limit": "stream_limit",
    "stream_busy": "stream_limit",
    "budget": "budget",
    "session_cap": "session_cap",
    "shutting_down": "session_cap",
    "unauthorized": "unauthorized",
    "forbidden": "unauthorized",
}


def admission_outcome(status: int, code: str) -> str:
    """Map a refused POST to its ``admissions`` outcome label."""
    if code in _OUTCOME_BY_CODE:
        return _OUTCOME_BY_CODE[code]
    return "bad_request" if 400 <= status < 500 else "error"


def _discard(codec: object, frame: object) -> None:
    """Sink of a tapped track nobody decodes."""


@dataclass(slots=True)
class MediaWiring:
    """What negotiation set up for the pipeline before the session object exists."""

    session_id: str
    intakes: list[FrameIntake] = field(default_factory=list)
    early_errors: list[BaseException] = field(default_factory=list)
    session: WhipSession | None = None
    on_fault: Callable[[WhipSession, str, BaseException], None] | None = None

    def tap_failed(self, exc: BaseException) -> None:
        """A tap reported that it did not take effect or that its sink failed."""
        if self.session is None or self.on_fault is None:
            self.early_errors.append(exc)
        else:
            self.on_fault(self.session, "intake", exc)


class SessionSupersededConflictError(HttpError):
    """``reconnect = "reject"`` and the stream already has a live session."""

    http_status = 409
    code = "stream_busy"


@dataclass(frozen=True, slots=True)
class Admitted:
    """What the 201 answer needs."""

    session: WhipSession
    answer_sdp: str


def new_id(prefix: str) -> str:
    """An unguessable id (128 bits from the OS CSPRNG)."""
    return f"{prefix}{secrets.token_urlsafe(16)}"


class SessionManager:
    """Owns the session table and every session's lifecycle."""

    def __init__(self, config: Config, timeline: Timeline) -> None:
        self.config = config
        self.timeline = timeline
        limits = config.limits
        self.slots = StreamSlots(limits.stream_limit, timeline.runs.count_active_runs_for_principal)
        self.budget = MediaBudget(limits.media_budget_bytes, limits.media_budget_threads)
        self.table: SessionTable[WhipSession] = SessionTable(
            limits.max_sessions,
            tombstone_ttl_s=limits.tombstone_ttl_s,
            tombstone_cap=limits.tombstone_capacity,
        )
        self._background: set[asyncio.Task[Any]] = set()
        self.check_turns = TurnGate(limits.sdp_checks_per_turn)
        """Turns for the SDP checks of ``POST /whip`` (:mod:`whip.turns`)."""
        self.negotiation_gate = LeaseGate(limits.negotiation_concurrency, NEGOTIATION_LEASE_S)
        """Bounds the negotiations running at once (module doc)."""
        self._shutting_down = False
        self.admissions: dict[str, int] = dict.fromkeys(ADMISSION_OUTCOMES, 0)
        """WHIP POSTs by outcome (loop thread only)."""
        self.totals: dict[str, int] = dict.fromkeys(
            (
                "frames_decoded",
                "frames_dropped",
                "frames_oversized",
                "decode_errors",
                "inbound_bytes",
                "rtp_packets_lost",
                "worker_faults",
                "forced_shutdowns",
            ),
            0,
        )
        """Counters of closed sessions (live ones are added at scrape time)."""
        self.rtp_discarded: dict[str, int] = RtpGuard.no_counts()
        """Of closed sessions: datagrams and RTP packets that never reached a frame, by
        reason (:class:`whip.rtc.rtp_guard.RtpGuard`; live ones added at scrape time)."""
        self.post_latency = Histogram(LATENCY_S)
        self.first_frame_latency = Histogram(LATENCY_S)

    # ------------------------------------------------------------ detached work

    def detach(self, coro: Awaitable[T], name: str) -> asyncio.Task[T]:
        """Run ``coro`` as a task the caller's cancellation cannot reach."""
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def run_detached(self, coro: Awaitable[T], name: str) -> T:
        """Await ``coro`` in a detached task. Cancellation: the caller stops waiting; the
        task runs to completion."""
        return await asyncio.shield(self.detach(coro, name))

    # ------------------------------------------------------------ the transaction

    async def admit(
        self, principal: str, stream: str, offer_sdp: str, summary: OfferSummary, posted_at: float
    ) -> Admitted:
        """The session transaction (module doc), detached from the request."""
        return await self.run_detached(
            self._transaction(principal, stream, offer_sdp, summary, posted_at), "whip-admit"
        )

    def _refuse_if_shutting_down(self) -> None:
        if self._shutting_down:
            raise HttpError(
                "server is shutting down",
                http_status=503,
                code="shutting_down",
                headers={"Retry-After": "5"},
            )

    async def _transaction(
        self, principal: str, stream: str, offer_sdp: str, summary: OfferSummary, posted_at: float
    ) -> Admitted:
        self._refuse_if_shutting_down()
        await self._handle_reconnect(principal, stream)
        slot = self.slots.reserve(principal)
        try:
            tracks = len(summary.accepted)
            pipeline = self.config.pipeline
            permit = self.budget.reserve(pipeline.media_bytes(tracks), pipeline.workers_per_session)
        except BaseException:
            slot.release()
            raise
        pc: RTCPeerConnection | None = None
        try:
            session_id = new_id("s_")
            run_id = new_id("r_")
            wiring = MediaWiring(session_id, on_fault=self._report_fault)
            async with self.negotiation_gate.lease():
                pc, liveness, answer = await self._negotiate(offer_sdp, summary, wiring)
            session = WhipSession(
                session_id=session_id,
                run_id=run_id,
                principal=principal,
                stream=stream,
                pc=pc,
                permit=permit,
                etag=f'"{secrets.token_hex(8)}"',
                posted_at=posted_at,
                liveness=liveness,
            )
            await self.timeline.append(
                NewEvent(
                    run_id,
                    EventType.RUN_CREATED,
                    principal,
                    {
                        "stream": stream,
                        "session_id": session_id,
                        "codecs": [
                            p.chosen.encoding for p in summary.accepted if p.chosen is not None
                        ],
                    },
                )
            )
        except BaseException:
            if pc is not None:
                await self._close_peer_quietly(pc, "admission failed")
            permit.release()
            slot.release()
            raise
        slot.release()  # the durable run now counts as committed
        try:
            self._refuse_if_shutting_down()
            self.table.insert(session_id, session)
        except (HttpError, SessionIdCollisionError) as exc:
            self.detach(self._tombstone_run(run_id, principal), f"tombstone-{run_id}")
            await self._close_peer_quietly(pc, f"run {run_id}: insert refused")
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
        session.reclaimer = asyncio.create_task(
            self._reclaimer(session), name=f"reclaim-{session_id}"
        )
        self._start_runtime(session, wiring)
        logger.info(
            "session %s run %s: admitted for %s stream %r", session_id, run_id, principal, stream
        )
        return Admitted(session, answer)

    @staticmethod
    async def _close_peer_quietly(pc: RTCPeerConnection, what: str) -> None:
        """Close ``pc``; an error is logged, never raised over the transaction's own."""
        try:
            await pc.close()
        except Exception:
            logger.exception("%s: peer close failed", what)

    async def _negotiate(
        self, offer_sdp: str, summary: OfferSummary, wiring: MediaWiring
    ) -> tuple[RTCPeerConnection, Liveness, str]:
        # Configured STUN/TURN servers are for publishers (the Link headers); the server
        # itself gathers host candidates only (public_hosts covers a NAT), so an
        # unreachable STUN/TURN server can never stall an answer (aioice waits 5 s).
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            use_wide_certificate(pc)
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            except (ValueError, OperationError) as exc:
                # aiortc refuses some offers check_offer accepts: it wants rtcp-mux, ICE
                # credentials and a codec it knows on every m= section, rejected ones too.
                logger.warning("session %s: offer refused by aiortc: %r", wiring.session_id, exc)
                raise UnprocessableOfferError(f"offer refused by the WebRTC stack: {exc}") from exc
            for transceiver in pc.getTransceivers():
                receiving = restrict_codecs(transceiver, summary)
                transceiver.direction = "recvonly" if receiving else "inactive"
                self._tap(transceiver, summary, wiring, receiving=receiving)
            install_dtls_kick(pc)
            # Before setLocalDescription: ICE starts consent checks as soon as it connects.
            liveness = install_media_liveness(pc, self.config.limits.reclaim_after_s)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
            sdp = finalize_answer(pc.localDescription.sdp, summary, self.config.server.public_hosts)
        except BaseException:
            await self._close_peer_quietly(pc, "negotiation failed")
            raise
        return pc, liveness, sdp

    def _tap(
        self, transceiver: Any, summary: OfferSummary, wiring: MediaWiring, *, receiving: bool
    ) -> None:
        """Route one receiver's encoded frames into a bounded intake (never to aiortc's
        own decoder thread, whose queue is unbounded). An undecoded track is tapped too,
        into nothing: untapped, aiortc would decode it and grow memory without bound. So
        is a section the answer rejects (``receiving`` False: aiortc never starts its
        receiver), which still guards the transport it shares and gets no intake."""
        pipeline = self.config.pipeline
        receiver = transceiver.receiver
        if not receiving or (transceiver.kind == "audio" and not pipeline.analyze_audio):
            install_tap(receiver, _discard, on_error=wiring.tap_failed)
            return
        intake = FrameIntake(
            transceiver.kind,
            depth=pipeline.queue_depth,
            payload_limit=pipeline.payload_limit_bytes,
            on_need_keyframe=schedule_pli(receiver),
            label=f"{wiring.session_id} {transceiver.kind}",
        )
        install_tap(receiver, intake.offer, on_end=intake.close, on_error=wiring.tap_failed)
        wiring.intakes.append(intake)

    def _start_runtime(self, session: WhipSession, wiring: MediaWiring) -> None:
        """Start the analyzers and decode workers (no await: called right after the
        reclaimer starts, so a visible session always has its media owner too)."""
        pipeline = self.config.pipeline
        session.intakes = wiring.intakes
        wiring.session = session
        try:
            processors = [load_processor(spec) for spec in pipeline.processors]
        except PipelineError as exc:
            self._report_fault(session, "start", exc)
            return
        analysis = Analysis(
            self._emitter(session),
            run_id=session.run_id,
            settings=AnalysisSettings(
                stats_interval_s=pipeline.stats_interval_s,
                scene_threshold=pipeline.scene_threshold,
                thumbnail_interval_s=pipeline.thumbnail_interval_s,
                keyframes_only=pipeline.decode == "keyframes",
            ),
            kinds=[intake.kind for intake in wiring.intakes],
            processors=processors,
            thumbnail_dir=self.config.server.data_dir / "thumbnails",
            posted_at=session.posted_at,
        )
        session.analysis = analysis
        session.runtime = Supervisor(
            session.session_id,
            loop=asyncio.get_running_loop(),
            on_fault=lambda stage, exc: self._report_fault(session, stage, exc),
            on_frame=analysis.on_frame,
            codec_threads=pipeline.codec_threads,
            keyframes_only=pipeline.decode == "keyframes",
            max_pixels=pipeline.max_pixels,
            max_workers=session.permit.threads,
        )
        analysis.bind_supervisor(session.runtime)
        try:
            session.runtime.start(wiring.intakes)
        except Exception as exc:
            self._report_fault(session, "start", exc)
            return
        for early in wiring.early_errors:
            self._report_fault(session, "intake", early)

    def _emitter(self, session: WhipSession) -> Emit:
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

    def _report_fault(self, session: WhipSession, stage: str, exc: BaseException) -> None:
        """Loop thread: a worker or tap failed; record it durably, then close (fault)."""
        if session.closing:
            return
        logger.error(
            "session %s run %s: %s worker fault: %r", session.session_id, session.run_id, stage, exc
        )
        self.detach(self._fault(session, stage, exc), f"fault-{session.session_id}")

    async def _fault(self, session: WhipSession, stage: str, exc: BaseException) -> None:
        self.totals["worker_faults"] += 1
        await self._append_quietly(
            session, EventType.WORKER_FAULT, {"stage": stage, "error": repr(exc)[:500]}
        )
        await self.close(session, CloseReason.FAULT)

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

    async def _handle_reconnect(self, principal: str, stream: str) -> None:
        if not stream:
            return
        for session in self.table.live():
            if session.principal == principal and session.stream == stream:
                if self.config.server.reconnect == "reject":
                    raise SessionSupersededConflictError(
                        f"stream {stream!r} already has a live session"
                    )
                await self.close(session, CloseReason.SUPERSEDED)

    # ------------------------------------------------------------ the reclaimer

    async def _reclaimer(self, session: WhipSession) -> None:
        """Watch the peer; reclaim on failed/closed/disconnected or no connect in time.

        No lost wakeup: the change flag is cleared *before* the state is read, so a
        change during any await below sets it again. Whatever ends the watch (including
        an unexpected error), the session is closed as ``peer_gone`` unless another
        caller won it first. Cancellation: only :meth:`close` cancels it, after winning.
        """
        changed = asyncio.Event()
        pc = session.pc

        def on_change() -> None:
            session.state_history.append(pc.connectionState)
            changed.set()

        pc.on("connectionstatechange", on_change)
        connect_timeout = self.config.limits.connect_timeout_s
        deadline = time.monotonic() + connect_timeout
        try:
            while True:
                changed.clear()
                state = pc.connectionState
                if state in ("failed", "closed", "disconnected"):
                    return
                if state == "connected" and not session.connected:
                    session.connected = True
                    waited_ms = int((time.monotonic() - session.posted_at) * 1000)
                    await self._append_quietly(
                        session, EventType.SESSION_CONNECTED, {"ms_since_post": waited_ms}
                    )
                    continue
                timeout = ACTIVITY_TOUCH_S if session.connected else deadline - time.monotonic()
                if not session.connected and timeout <= 0:
                    logger.info(
                        "session %s run %s: no connection within %.0fs",
                        session.session_id,
                        session.run_id,
                        connect_timeout,
                    )
                    return
                try:
                    async with asyncio.timeout(timeout):
                        await changed.wait()
                except TimeoutError:
                    self._touch_if_alive(session)
        except Exception:
            logger.exception(
                "session %s run %s: reclaimer failed", session.session_id, session.run_id
            )
        finally:
            if not session.closing:
                self.detach(
                    self.close(session, CloseReason.PEER_GONE), f"reclaim-{session.session_id}"
                )

    def _touch_if_alive(self, session: WhipSession) -> None:
        """Media flowing is proof of life: keep the run from reading as expired."""
        liveness = session.liveness
        if liveness is not None and time.monotonic() - liveness.last_life() < ACTIVITY_TOUCH_S:
            self.timeline.runs.touch(session.run_id)

    async def _append_quietly(
        self, session: WhipSession, etype: str, data: dict[str, object]
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

    async def close(self, session: WhipSession, reason: CloseReason) -> bool:
        """End ``session`` if we win its removal; True for the one winner.

        Detached: a cancelled caller does not stop the close half-way.
        """
        if not self.table.remove_if_owned(session.session_id, session, session.run_id, reason):
            return False
        return await self.run_detached(self._finish(session, reason), f"close-{session.session_id}")

    async def _finish(self, session: WhipSession, reason: CloseReason) -> bool:
        session.closing = True
        current = asyncio.current_task()
        if session.reclaimer is not None and session.reclaimer is not current:
            session.reclaimer.cancel()
        before = await session_stats(session)  # RTP statistics die with the peer
        await self._close_peer_quietly(session.pc, f"session {session.session_id}")
        missed: list[str] = []
        if session.runtime is not None:
            # A clean end decodes what already arrived (bounded); a fault does not wait.
            pipeline = self.config.pipeline
            missed = await session.runtime.stop_async(
                pipeline.join_deadline_s,
                drain_s=0.0 if reason is CloseReason.FAULT else pipeline.drain_budget_s(),
            )
        after = await session_stats(session)
        if session.analysis is not None and not missed:
            # The workers are joined: the analyzers' state is ours to read now.
            for etype, data in session.analysis.close_episodes():
                await self._append_quietly(session, etype, data)
            await self._append_quietly(session, EventType.STATS, session.analysis.final_stats())
        totals = self.totals
        totals["frames_decoded"] += after.frames_decoded()
        totals["decode_errors"] += after.decode_errors()
        totals["frames_dropped"] += after.frames_dropped
        totals["frames_oversized"] += after.frames_oversized
        for why, count in after.rtp_discarded.items():
            self.rtp_discarded[why] = self.rtp_discarded.get(why, 0) + count
        totals["inbound_bytes"] += after.bytes_in
        totals["rtp_packets_lost"] += before.packets_lost
        if missed:
            totals["forced_shutdowns"] += 1
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
        logger.info(
            "session %s run %s: closed (%s)", session.session_id, session.run_id, reason.value
        )
        return True

    async def trickle(self, session: WhipSession, fragment: TrickleFragment) -> None:
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

    async def stop_run(self, run_id: str, principal: str) -> int:
        """Operator stop: durable ``stop_requested``, then the live session (if any) is
        closed with reason ``stopped``. One detached transaction: a client that hangs up
        cannot leave the event written and the media still running. Returns the seq of
        ``stop_requested``."""
        return await self.run_detached(self._stop(run_id, principal), f"stop-{run_id}")

    async def _stop(self, run_id: str, principal: str) -> int:
        seq = await self.timeline.append(
            NewEvent(run_id, EventType.STOP_REQUESTED, principal, {"by": principal})
        )
        session = self.find_by_run(run_id)
        if session is not None:
            await self.close(session, CloseReason.STOPPED)
        return seq

    async def delete_run(self, run_id: str, principal: str) -> DeleteResult:
        """Run delete: single-winner ``run_deleted`` (idempotent), then the live session
        (if any) is closed with reason ``stopped``; detached like :meth:`stop_run`."""
        return await self.run_detached(self._delete(run_id, principal), f"delete-{run_id}")

    async def _delete(self, run_id: str, principal: str) -> DeleteResult:
        result = await self.timeline.delete_run(run_id, principal, {"by": principal})
        session = self.find_by_run(run_id)
        if session is not None:
            await self.close(session, CloseReason.STOPPED)
        return result

    def find_by_run(self, run_id: str) -> WhipSession | None:
        """The live session of ``run_id``, if any."""
        for session in self.table.live():
            if session.run_id == run_id:
                return session
        return None

    async def shutdown(self) -> None:
        """Refuse new sessions, close every live one (reason ``shutdown``), wait for
        detached work. Sessions whose admission finishes during the wait are closed by
        the next pass (bounded: three passes)."""
        self._shutting_down = True
        for _ in range(3):
            sessions = self.table.live()
            await asyncio.gather(
                *(self.close(s, CloseReason.SHUTDOWN) for s in sessions), return_exceptions=True
            )
            pending = [t for t in self._background if not t.done()]
            if pending:
                await asyncio.wait(pending, timeout=10)
            if not self.table.live():
                return
        logger.error("shutdown: %d sessions still live after three passes", len(self.table))
