"""Single-winner deletion of a run: exactly one ``run_deleted``, however many callers race.

Protocol (per run; see :mod:`registry.runs` for the state table)::

    claim = compare-and-swap LIVE -> APPEND_IN_FLIGHT (under the registry lock)
    CLAIMED          append run_deleted; the WAL writer commits DELETED when it is
                     durable, or rolls back to LIVE if the batch failed
    MISSING          unknown run: same as CLAIMED on a placeholder (single winner too)
    ALREADY_DELETED  append nothing; answer with a synthesized event (no new seq)
    IN_FLIGHT        wait until the winner settles, then claim again

Why waiters always make progress: commit and rollback happen on the writer thread when
the batch settles, not in the claiming task, so a winner that is cancelled (a client
that hung up) still settles the state. A winner that fails *before* its event reaches
the queue rolls back itself, in a ``finally``-like path that also covers cancellation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from registry.events import Event, EventType, NewEvent, now_ms
from registry.runs import ClaimKind, RunRegistry
from registry.wal import Wal

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """The answer every deleter gets."""

    event: Event
    outcome: ClaimKind
    """CLAIMED or MISSING for the caller that appended; ALREADY_DELETED for the rest."""

    @property
    def synthesized(self) -> bool:
        """True when ``event`` was made up for this answer and never persisted."""
        return self.outcome is ClaimKind.ALREADY_DELETED


def synthesize_repeat(original: Event, principal: str) -> Event:
    """The answer to a repeated delete: same seq as the durable event, not persisted."""
    data = dict(original.data)
    data["already_deleted"] = True
    return Event(original.seq, original.run_id, original.type, now_ms(), principal, data)


class RunDeleter:
    """Async adapter of the protocol over the registry and the WAL."""

    def __init__(self, registry: RunRegistry, wal: Wal) -> None:
        self._registry = registry
        self._wal = wal

    async def delete(
        self, run_id: str, principal: str, data: dict[str, object] | None = None
    ) -> DeleteResult:
        """Delete ``run_id``; every caller gets an answer, one of them appends.

        Cancellation: a cancelled winner's append still settles the state (see module
        doc); a cancelled waiter just stops waiting.
        """
        while True:
            claim = self._registry.claim_delete(run_id, principal)
            if claim.kind is ClaimKind.ALREADY_DELETED:
                assert claim.deleted_event is not None
                return DeleteResult(
                    synthesize_repeat(claim.deleted_event, principal), ClaimKind.ALREADY_DELETED
                )
            if claim.kind is ClaimKind.IN_FLIGHT:
                assert claim.settled is not None
                await claim.settled
                continue
            owner = claim.principal or principal
            event = NewEvent(run_id, EventType.RUN_DELETED, owner, dict(data or {}))
            queued = False
            try:
                fut = await self._wal.submit(event)
                queued = True
            finally:
                if not queued:
                    self._registry.fail_deletes([run_id])
            seq = await fut
            logger.info("run %s: deleted at seq %d (%s)", run_id, seq, claim.kind.value)
            return DeleteResult(
                Event(seq, run_id, event.type, event.ts_ms, event.principal, event.data),
                claim.kind,
            )
