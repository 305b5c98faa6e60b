"""Stop and delete of runs: the policy, in one place, for every caller.

``POST /v1/runs/{id}/stop`` and ``DELETE /v1/runs/{id}`` call :class:`RunControl`; it
decides, appends and closes the live session through the session manager.

Visibility: a caller sees only its own runs, operators see all; another principal's run
answers exactly like a run that does not exist (404 ``not_found``), so ids cannot be
probed (:meth:`RunControl.visible`).

Stop (:meth:`RunControl.stop`): durable ``stop_requested``, then the live session (if
any) is closed with reason ``stopped``, in one detached transaction (a client that hangs
up cannot leave the event written and the media still running). Decisions:

- a run ``ended``, ``interrupted`` or ``deleted`` is 409 ``not_live``;
- a run already stopping (a stop in flight in this process, or the state ``stopping``)
  answers ``repeat: true`` with the seq of the first ``stop_requested``: nothing is
  appended again; concurrent stops of one run share one transaction (the in-flight table,
  loop thread only);
- ``starting``, ``live`` and ``expired`` runs can be stopped.

Delete (:meth:`RunControl.delete`): single-winner ``run_deleted`` (the registry's
deletion protocol; a repeat gets the synthesized event), then the live session is closed
with reason ``stopped``, detached like a stop. A run id never seen (or no longer
retained) is 404 and nothing is appended: existence is checked first, because the
registry's delete appends ``run_deleted`` for unknown ids.

Cluster mode: the run's live session may be on another node. When it is not in this
node's table, the owner is told through the store (:meth:`ClusterTimeline.request_close`,
a NOTIFY the owner acts on), after the durable event; the owner closes it with reason
``stopped`` as if the call had reached it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from registry.deletion import DeleteResult
from registry.events import EventType, NewEvent
from registry.runs import RunView
from registry.timeline import MAX_READ_LIMIT, Timeline
from whip.auth import Principal
from whip.detached import DetachedTasks
from whip.errors import HttpError, NotFoundError
from whip.live_session import CloseReason, LiveSession

if TYPE_CHECKING:
    from registry.pg.timeline import ClusterTimeline

logger = logging.getLogger(__name__)

NOT_LIVE = frozenset({"ended", "interrupted", "deleted"})


class NotLiveError(HttpError):
    """Stop of a run that is over."""

    http_status = 409
    code = "not_live"


@dataclass(frozen=True, slots=True)
class StopResult:
    """What a stop answers: the run after it, the first ``stop_requested`` seq, and
    whether this call only repeated an earlier stop."""

    run: RunView
    seq: int | None
    repeat: bool


class RunControl:
    """Stop and delete of runs (module doc)."""

    def __init__(
        self,
        timeline: Timeline | ClusterTimeline,
        detached: DetachedTasks,
        find_session: Callable[[str], LiveSession | None],
        close: Callable[[LiveSession, CloseReason], Awaitable[bool]],
    ) -> None:
        self.timeline = timeline
        self._detached = detached
        self._find_session = find_session
        self._close = close
        self._stops: dict[str, asyncio.Task[int]] = {}

    async def visible(self, run_id: str, caller: Principal) -> RunView:
        """The run, if it exists and ``caller`` may see it; else 404 (module doc)."""
        view = await self.timeline.get_run(run_id)
        if view is None or not (caller.is_operator or view.principal == caller.name):
            raise NotFoundError("run")
        return view

    async def stop(self, run_id: str, caller: Principal) -> StopResult:
        """Stop ``run_id`` (module doc for the decisions).

        Cancellation: the stop transaction runs on (it is detached); only the answer is
        lost."""
        view = await self.visible(run_id, caller)
        task = self._stops.get(run_id)
        repeat = task is not None
        seq: int | None = None
        if task is None and view.state == "stopping":
            seq = await self._first_stop_seq(run_id)
            repeat = True
        elif task is None:
            if view.state in NOT_LIVE:
                raise NotLiveError(f"run is {view.state}; only a live run can be stopped")
            task = self._detached.detach(self._stop(run_id, caller.name), f"stop-{run_id}")
            self._stops[run_id] = task
            task.add_done_callback(self._forget_stop(run_id))
        if task is not None:
            seq = await asyncio.shield(task)
        after = await self.timeline.get_run(run_id) or view
        logger.info(
            "run %s: stop by %s (repeat %s) -> %s", run_id, caller.name, repeat, after.state
        )
        return StopResult(after, seq, repeat)

    async def request_stop(self, run_id: str, by: str) -> int:
        """The stop transaction alone, without the decisions of :meth:`stop` (for a
        caller that already decided, such as the tests' closers race): durable
        ``stop_requested``, then the live session's close; the seq. Detached.

        Cancellation: the transaction runs on; only the answer is lost."""
        return await self._detached.run(self._stop(run_id, by), f"stop-{run_id}")

    async def _stop(self, run_id: str, by: str) -> int:
        seq = await self.timeline.append(NewEvent(run_id, EventType.STOP_REQUESTED, by, {"by": by}))
        await self._close_live(run_id, "stop")
        return seq

    async def _close_live(self, run_id: str, action: str) -> None:
        """Close the run's live session: here if it is here, else on its owner node."""
        session = self._find_session(run_id)
        if session is not None:
            await self._close(session, CloseReason.STOPPED)
        elif not isinstance(self.timeline, Timeline):
            owner = await self.timeline.request_close(run_id, action)
            if owner is not None:
                logger.info("run %s: %s carried to its owner node %s", run_id, action, owner)

    def _forget_stop(self, run_id: str) -> Callable[[asyncio.Task[int]], None]:
        def done(task: asyncio.Task[int]) -> None:
            if self._stops.get(run_id) is task:
                del self._stops[run_id]
            if not task.cancelled() and task.exception() is not None:
                logger.warning("run %s: stop failed: %r", run_id, task.exception())

        return done

    async def _first_stop_seq(self, run_id: str) -> int | None:
        """The seq of the run's first ``stop_requested`` (a repeat's answer). Reads the
        run's history: only for the rare repeat that no in-flight stop can answer."""
        after = 0
        while True:
            batch = await self.timeline.read_events(run_id, after, MAX_READ_LIMIT)
            for event in batch:
                if event.type == EventType.STOP_REQUESTED:
                    return event.seq
            if len(batch) < MAX_READ_LIMIT:
                return None
            after = batch[-1].seq

    async def delete(self, run_id: str, caller: Principal) -> DeleteResult:
        """Delete ``run_id`` (module doc). Cancellation: as :meth:`stop`."""
        await self.visible(run_id, caller)
        return await self.request_delete(run_id, caller.name)

    async def request_delete(self, run_id: str, by: str) -> DeleteResult:
        """The delete transaction alone (no visibility check): single-winner
        ``run_deleted``, then the live session's close. Detached.

        Cancellation: the transaction runs on; only the answer is lost."""
        return await self._detached.run(self._delete(run_id, by), f"delete-{run_id}")

    async def _delete(self, run_id: str, by: str) -> DeleteResult:
        result = await self.timeline.delete_run(run_id, by, {"by": by})
        if not result.synthesized:
            await self._close_live(run_id, "delete")
        else:
            session = self._find_session(run_id)
            if session is not None:
                await self._close(session, CloseReason.STOPPED)
        return result
