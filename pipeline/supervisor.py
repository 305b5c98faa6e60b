"""One session's worker generation: start, fault reporting, stop with a join deadline.

ARCHITECTURE.md "Flow of one push", step 4. A :class:`Supervisor` owns the decode
worker threads of one session, one per track (``decode-video-<session>``,
``decode-audio-<session>``; the thread name is its *stage* plus the session label). A
further simulcast layer's intake (``FrameIntake.layer``, ``decode-video2``...) is decoded
and counted, but its frames go to no ``on_frame`` (the analyzers of a kind live on one
thread).

- :meth:`Supervisor.start` starts them all or none: if a thread fails to start, the
  ones already running are stopped (their intakes closed) and joined within
  ``start_join_s``, and the original exception is re-raised.
- The first worker that ends with an exception before a stop was requested is a
  *fault*: ``on_fault(stage, exc)`` runs once, on the event loop thread (posted with
  ``call_soon_threadsafe``). The owner closes the peer and stops the supervisor; the
  siblings are not stopped here. Exceptions raised after a stop was requested, and any
  later ones, are logged and kept in :attr:`Supervisor.faults` only.
- :meth:`Supervisor.stop` (blocking, for threads and tests) or
  :meth:`Supervisor.stop_async` (on the loop, never blocks it) closes every intake
  (queued frames discarded, or first drained for a bounded time on a clean end),
  waits for the workers up to a deadline and returns the names of those that missed
  it. Those threads are left running detached (daemon
  threads: they cannot hold up process exit); the caller keeps their media permit
  (forced shutdown) and can read :attr:`Supervisor.detached` later.

State machine (data, h11 style): NEW -> RUNNING -> STOPPED, NEW -> STOPPED. STOPPED is
absorbing; :meth:`start` is allowed only in NEW, stopping is idempotent in any state.

Ownership and locks: the supervisor is created and driven by the session's owner on the
event loop thread; its worker threads only touch their own :class:`Worker` record and
call back through :meth:`Supervisor._worker_exited`. ``Supervisor._lock`` guards
the state, the fault claim and :attr:`faults`; it is a leaf: no intake method, callback
or join runs while it is held. Each :class:`~pipeline.intake.FrameIntake` has its own
leaf lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from pipeline.decoder import DecodeStats, FrameCallback, decoder_worker
from pipeline.errors import SupervisorStateError
from pipeline.intake import FrameIntake

logger = logging.getLogger(__name__)

START_JOIN_S = 1.0
"""Default bounded join for the workers of a start that failed half-way."""


class SupervisorState(StrEnum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


_TRANSITIONS: dict[SupervisorState, frozenset[SupervisorState]] = {
    SupervisorState.NEW: frozenset({SupervisorState.RUNNING, SupervisorState.STOPPED}),
    SupervisorState.RUNNING: frozenset({SupervisorState.STOPPED}),
    SupervisorState.STOPPED: frozenset(),
}


@dataclass(eq=False, slots=True)
class Worker:
    """One worker thread and what it works on. ``error`` and ``done`` are written by the
    worker thread (``done`` last); everything else is fixed before the thread starts."""

    stage: str
    """``decode-video`` / ``decode-audio`` (``decode-video2`` for a second video track)."""
    name: str
    """The thread name: ``<stage>-<session label>``."""
    intake: FrameIntake
    stats: DecodeStats
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def supervised_worker(
    worker: Worker, run: Callable[[], None], exited: Callable[[Worker], None]
) -> None:
    """A worker thread's body: ``run()``, then report the exit (always, exactly once).

    The intake is closed on the way out (queued frames discarded): a dead worker holds no
    queue memory and its producer just counts drops. No exception escapes the thread.
    """
    try:
        run()
    except BaseException as exc:
        worker.error = exc
    finally:
        worker.intake.close(drain=False)
        worker.done.set()
        exited(worker)


class Supervisor:
    """The worker generation of one session (module doc)."""

    def __init__(
        self,
        session: str,
        *,
        loop: asyncio.AbstractEventLoop,
        on_fault: Callable[[str, BaseException], object] | None = None,
        on_frame: FrameCallback | None = None,
        codec_threads: int = 1,
        keyframes_only: bool = False,
        max_pixels: int | None = None,
        max_workers: int | None = None,
        start_join_s: float = START_JOIN_S,
    ) -> None:
        self.session = session
        self._loop = loop
        self._on_fault = on_fault
        self._on_frame = on_frame
        self._codec_threads = codec_threads
        self._keyframes_only = keyframes_only
        self._max_pixels = max_pixels
        self._max_workers = max_workers
        self._start_join_s = start_join_s
        self._lock = threading.Lock()
        self._state = SupervisorState.NEW
        self._stop_requested = False
        self._fault_claimed = False
        self._workers: tuple[Worker, ...] = ()
        self._exited_count = 0
        self._all_exited = asyncio.Event()
        self.faults: list[tuple[str, BaseException]] = []
        """Every worker exception, in order (the first one before a stop is the fault)."""
        self.state_history: list[SupervisorState] = [SupervisorState.NEW]

    # ------------------------------------------------------------ state

    @property
    def state(self) -> SupervisorState:
        return self._state

    def _move_locked(self, new: SupervisorState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise SupervisorStateError(
                f"supervisor {self.session}: {self._state} -> {new} not allowed"
            )
        logger.debug("supervisor %s: %s -> %s", self.session, self._state, new)
        self._state = new
        self.state_history.append(new)

    @property
    def workers(self) -> tuple[Worker, ...]:
        return self._workers

    @property
    def detached(self) -> list[str]:
        """Names of worker threads still running after a stop (forced shutdown)."""
        if not self._stop_requested:
            return []
        return [w.name for w in self._workers if not w.done.is_set()]

    def stats(self) -> dict[str, DecodeStats]:
        """Decode counters by stage."""
        return {w.stage: w.stats for w in self._workers}

    # ------------------------------------------------------------ start

    def start(self, intakes: Iterable[FrameIntake]) -> None:
        """Start one worker thread per intake (module doc: all or none).

        Call on the event loop thread. Raises :class:`SupervisorStateError` unless NEW,
        ``ValueError`` for more intakes than ``max_workers`` (before starting anything),
        and re-raises a thread start failure after stopping what started (bounded by
        ``start_join_s``, so it may block that long; threads that miss it are in
        :attr:`detached`).
        """
        intakes = list(intakes)
        if self._max_workers is not None and len(intakes) > self._max_workers:
            raise ValueError(
                f"supervisor {self.session}: {len(intakes)} tracks need {len(intakes)} workers, "
                f"the permit has {self._max_workers}"
            )
        workers: list[Worker] = []
        seen: dict[str, int] = {}
        for intake in intakes:
            seen[intake.kind] = seen.get(intake.kind, 0) + 1
            stage = f"decode-{intake.kind}" + (
                str(seen[intake.kind]) if seen[intake.kind] > 1 else ""
            )
            workers.append(
                Worker(
                    stage=stage,
                    name=f"{stage}-{self.session}",
                    intake=intake,
                    stats=DecodeStats(intake.kind),
                )
            )
        with self._lock:
            self._move_locked(SupervisorState.RUNNING)
            self._workers = tuple(workers)
        started: list[Worker] = []
        try:
            for worker in workers:
                worker.thread = threading.Thread(
                    target=supervised_worker,
                    name=worker.name,
                    args=(worker, self._body(worker), self._worker_exited),
                    daemon=True,
                )
                worker.thread.start()
                started.append(worker)
        except BaseException:
            logger.exception(
                "supervisor %s: worker start failed; stopping the others", self.session
            )
            with self._lock:
                self._workers = tuple(started)
            self.stop(self._start_join_s)
            raise
        logger.info("supervisor %s: started %s", self.session, ", ".join(w.name for w in workers))

    def _body(self, worker: Worker) -> Callable[[], None]:
        def run() -> None:
            decoder_worker(
                worker.intake,
                worker.stats,
                codec_threads=self._codec_threads,
                keyframes_only=self._keyframes_only,
                max_pixels=self._max_pixels,
                # A further simulcast layer is decoded and counted, not analysed: the
                # analyzers of a kind live on one thread (pipeline.analysis).
                on_frame=self._on_frame if worker.intake.layer is None else None,
            )

        return run

    # ------------------------------------------------------------ exits and faults

    def _worker_exited(self, worker: Worker) -> None:
        """On the worker thread, after ``worker.done`` is set."""
        deliver = False
        if worker.error is not None:
            with self._lock:
                self.faults.append((worker.stage, worker.error))
                if not self._fault_claimed and not self._stop_requested:
                    self._fault_claimed = deliver = True
                stopping = self._stop_requested
            logger.error(
                "supervisor %s: %s failed%s",
                self.session,
                worker.name,
                " during stop" if stopping else "",
                exc_info=worker.error,
            )
        else:
            logger.info("supervisor %s: %s ended", self.session, worker.name)
        if deliver:
            assert worker.error is not None
            self._post(self._deliver_fault, worker.stage, worker.error)
        self._post(self._count_exit)

    def _post(self, callback: Callable[..., object], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            logger.warning("supervisor %s: loop closed; %s not delivered", self.session, callback)

    def _deliver_fault(self, stage: str, exc: BaseException) -> None:
        if self._on_fault is None:
            return
        try:
            self._on_fault(stage, exc)
        except Exception:
            logger.exception("supervisor %s: on_fault failed", self.session)

    def _count_exit(self) -> None:
        self._exited_count += 1
        if self._exited_count >= len(self._workers):
            self._all_exited.set()

    # ------------------------------------------------------------ stop

    def _request_stop(self, *, drain: bool = False) -> tuple[Worker, ...]:
        with self._lock:
            self._stop_requested = True
            if self._state is not SupervisorState.STOPPED:
                self._move_locked(SupervisorState.STOPPED)
            workers = self._workers
        for worker in workers:
            worker.intake.close(drain=drain)
        return workers

    def _missed(self, workers: tuple[Worker, ...]) -> list[str]:
        missed = [w.name for w in workers if not w.done.is_set()]
        if missed:
            logger.warning(
                "supervisor %s: forced shutdown: %s missed the join deadline",
                self.session,
                ", ".join(missed),
            )
        return missed

    def stop(self, deadline_s: float) -> list[str]:
        """Stop every worker; block up to ``deadline_s`` in all; return the names of the
        threads that missed the deadline (left detached). Idempotent.

        Blocks the calling thread: on the event loop use :meth:`stop_async`.
        """
        workers = self._request_stop()
        deadline = time.monotonic() + deadline_s
        for worker in workers:
            if worker.thread is not None and worker.thread.ident is not None:
                worker.thread.join(max(0.0, deadline - time.monotonic()))
        return self._missed(workers)

    async def stop_async(self, deadline_s: float, *, drain_s: float = 0.0) -> list[str]:
        """:meth:`stop` without blocking the loop (waits for the workers' exit posts).

        With ``drain_s`` > 0 (a clean end: the peer is closed, no frame comes any more)
        the workers first get up to ``drain_s`` to decode what is already queued; what is
        left after that is discarded (counted as dropped). The drain is part of
        ``deadline_s``, not added to it, so a worker that misses the deadline is reported
        at the same moment either way.

        Call on the supervisor's loop. Cancellation: the stop itself (intakes closed) has
        already happened; only the wait is abandoned.
        """
        deadline = self._loop.time() + deadline_s
        workers = self._request_stop(drain=drain_s > 0)
        if drain_s > 0 and not await self._wait_exited(workers, min(drain_s, deadline_s)):
            for worker in workers:
                worker.intake.close(drain=False)
        await self._wait_exited(workers, deadline - self._loop.time())
        return self._missed(workers)

    async def _wait_exited(self, workers: tuple[Worker, ...], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every worker's exit post; True if all exited."""
        if not workers or all(w.done.is_set() for w in workers):
            return True
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._all_exited.wait()
        except TimeoutError:
            return False
        return True
