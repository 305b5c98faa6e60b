"""Admission: per-principal stream slots and the process-wide media budget.

Both are reserved at the start of the session transaction and each reservation is
released exactly once (``release`` is idempotent and thread-safe).

Stream slots: a principal may hold at most ``limit`` active runs, counted as its
*committed* runs (the registry's live count) plus its *reservations* (transactions in
flight), checked and incremented under one lock. A reservation is released once its
``run_created`` is durable (the run then counts as committed) or when the transaction
fails. In the short window between the two the run counts twice, which can only refuse
too early, never admit one too many.

Media budget: bytes (payload limit x queue depth x tracks) and decode threads,
process-wide, reserved together or not at all. A permit whose worker threads missed
their join deadline is *kept* (:meth:`MediaPermit.keep`): its amounts move to the
"kept by forced shutdown" totals and are never returned, since those threads still hold
the memory.

Lock order: ``StreamSlots._lock`` -> the registry's lock (taken inside
``committed_count``). ``MediaBudget._lock`` is a leaf.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from whip.errors import HttpError

logger = logging.getLogger(__name__)


ADMISSION_OUTCOMES = (
    "accepted",
    "stream_limit",
    "budget",
    "session_cap",
    "bad_request",
    "unauthorized",
    "error",
)
"""``whip_admissions_total{outcome}`` label values: what became of each WHIP POST."""

_OUTCOME_BY_CODE = {
    "stream_limit": "stream_limit",
    "stream_busy": "stream_limit",
    "budget": "budget",
    "session_cap": "session_cap",
    "shutting_down": "session_cap",
    "unauthorized": "unauthorized",
    "forbidden": "unauthorized",
}


def admission_outcome(http_status: int, code: str) -> str:
    """The :data:`ADMISSION_OUTCOMES` label of a refused POST."""
    if code in _OUTCOME_BY_CODE:
        return _OUTCOME_BY_CODE[code]
    return "bad_request" if 400 <= http_status < 500 else "error"


class StreamLimitError(HttpError):
    """The principal already holds its maximum of active runs."""

    http_status = 409
    code = "stream_limit"


class BudgetExhaustedError(HttpError):
    """The process-wide media budget cannot take another session right now."""

    http_status = 503
    code = "budget"


class StreamSlot:
    """One reserved stream slot; :meth:`release` returns it exactly once."""

    __slots__ = ("_owner", "_released", "principal")

    def __init__(self, owner: StreamSlots, principal: str) -> None:
        self._owner = owner
        self.principal = principal
        self._released = False

    def release(self) -> bool:
        """Return the slot; True for the one call that actually released it."""
        return self._owner._release(self)


class StreamSlots:
    """Per-principal active-run limit over committed runs plus reservations."""

    def __init__(self, limit: int, committed_count: Callable[[str], int]) -> None:
        if limit < 1:
            raise ValueError("stream limit must be at least 1")
        self.limit = limit
        self._committed_count = committed_count
        self._lock = threading.Lock()
        self._reserved: dict[str, int] = {}

    def reserve(self, principal: str) -> StreamSlot:
        """Reserve a slot or raise :class:`StreamLimitError` (409)."""
        with self._lock:
            held = self._committed_count(principal) + self._reserved.get(principal, 0)
            if held >= self.limit:
                raise StreamLimitError(
                    f"principal {principal!r} already has {held} active streams "
                    f"(limit {self.limit})"
                )
            self._reserved[principal] = self._reserved.get(principal, 0) + 1
            return StreamSlot(self, principal)

    def _release(self, slot: StreamSlot) -> bool:
        with self._lock:
            if slot._released:
                return False
            slot._released = True
            left = self._reserved[slot.principal] - 1
            if left:
                self._reserved[slot.principal] = left
            else:
                del self._reserved[slot.principal]
            return True

    def reserved(self, principal: str | None = None) -> int:
        """Reservations in flight (for one principal, or all)."""
        with self._lock:
            if principal is not None:
                return self._reserved.get(principal, 0)
            return sum(self._reserved.values())


@dataclass(frozen=True, slots=True)
class BudgetFigures:
    """A consistent reading of the budget (metrics)."""

    bytes_total: int
    threads_total: int
    bytes_reserved: int
    threads_reserved: int
    bytes_kept: int
    threads_kept: int


class MediaPermit:
    """Bytes and threads reserved for one session."""

    __slots__ = ("_budget", "_settled", "nbytes", "threads")

    def __init__(self, budget: MediaBudget, nbytes: int, threads: int) -> None:
        self._budget = budget
        self.nbytes = nbytes
        self.threads = threads
        self._settled = False

    def release(self) -> bool:
        """Return the reservation; True for the one call that did."""
        return self._budget._settle(self, keep=False)

    def keep(self) -> bool:
        """Never return it (forced shutdown: a detached thread still holds the memory)."""
        return self._budget._settle(self, keep=True)

    @property
    def settled(self) -> bool:
        """Released or kept."""
        return self._settled


class MediaBudget:
    """Process-wide bytes + threads, reserved atomically together."""

    def __init__(self, total_bytes: int, total_threads: int) -> None:
        if total_bytes < 1 or total_threads < 1:
            raise ValueError("media budget must be positive")
        self.total_bytes = total_bytes
        self.total_threads = total_threads
        self._lock = threading.Lock()
        self._bytes = 0
        self._threads = 0
        self._kept_bytes = 0
        self._kept_threads = 0

    def reserve(self, nbytes: int, threads: int) -> MediaPermit:
        """Reserve both or raise :class:`BudgetExhaustedError` (503, Retry-After)."""
        if nbytes < 0 or threads < 0:
            raise ValueError("negative reservation")
        with self._lock:
            if (
                self._bytes + nbytes > self.total_bytes
                or self._threads + threads > self.total_threads
            ):
                raise BudgetExhaustedError(
                    "media budget exhausted; retry later",
                    headers={"Retry-After": "5"},
                )
            self._bytes += nbytes
            self._threads += threads
            return MediaPermit(self, nbytes, threads)

    def _settle(self, permit: MediaPermit, *, keep: bool) -> bool:
        with self._lock:
            if permit._settled:
                return False
            permit._settled = True
            if keep:
                self._kept_bytes += permit.nbytes
                self._kept_threads += permit.threads
            else:
                self._bytes -= permit.nbytes
                self._threads -= permit.threads
            return True

    def figures(self) -> BudgetFigures:
        """Totals, reservations (kept ones included) and what forced shutdowns keep."""
        with self._lock:
            return BudgetFigures(
                self.total_bytes,
                self.total_threads,
                self._bytes,
                self._threads,
                self._kept_bytes,
                self._kept_threads,
            )
