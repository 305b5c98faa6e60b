"""The live-session table: an exact cap, single-winner removal, reclaimed tombstones.

Rules:

- :meth:`SessionTable.insert` is an exact check-and-increment against ``max_sessions``
  under one lock: the table never holds more, however many inserts race.
- :meth:`SessionTable.remove_if_owned` removes a session only if the table still maps
  its id to *that* entry. Exactly one caller wins (reclaimer, session DELETE, operator
  stop or delete, shutdown, supersede); the rest get ``False`` and must do nothing more.
- The winner leaves a tombstone (reason, time) so a later DELETE of the same session URL
  is answered 200 from it. Tombstones live ``tombstone_ttl_s`` (600) and at most
  ``tombstone_cap`` (1024) are kept; the oldest goes first.

``_lock`` is a leaf lock. The table stores opaque entries (the WHIP session objects); it
does not close anything itself.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from whip.errors import HttpError


class SessionCapError(HttpError):
    """``max_sessions`` live sessions already."""

    http_status = 503
    code = "session_cap"


class SessionIdCollisionError(Exception):
    """The id is already in the table (the caller releases its slot and retries)."""


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What is left of a reclaimed session."""

    session_id: str
    run_id: str
    reason: str
    at: float


class SessionTable[E]:
    """Live sessions by id, capped exactly, with single-winner removal."""

    def __init__(
        self,
        max_sessions: int,
        *,
        tombstone_ttl_s: float = 600.0,
        tombstone_cap: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self._ttl = tombstone_ttl_s
        self._cap = tombstone_cap
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, E] = {}
        self._tombstones: OrderedDict[str, Tombstone] = OrderedDict()

    def insert(self, session_id: str, entry: E) -> None:
        """Insert or raise :class:`SessionCapError` / :class:`SessionIdCollisionError`."""
        with self._lock:
            if session_id in self._live or session_id in self._tombstones:
                raise SessionIdCollisionError(session_id)
            if len(self._live) >= self.max_sessions:
                raise SessionCapError(
                    f"{self.max_sessions} sessions are live; retry later",
                    headers={"Retry-After": "5"},
                )
            self._live[session_id] = entry

    def remove_if_owned(self, session_id: str, entry: E, run_id: str, reason: str) -> bool:
        """Remove ``entry`` if it is still the one under ``session_id``; one caller wins."""
        with self._lock:
            if self._live.get(session_id) is not entry:
                return False
            del self._live[session_id]
            self._tombstones[session_id] = Tombstone(session_id, run_id, reason, self._clock())
            self._prune_locked()
            return True

    def get(self, session_id: str) -> E | None:
        """The live entry, or None."""
        with self._lock:
            return self._live.get(session_id)

    def tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of a reclaimed session still within its TTL, or None."""
        with self._lock:
            self._prune_locked()
            return self._tombstones.get(session_id)

    def live(self) -> list[E]:
        """A copy of the live entries."""
        with self._lock:
            return list(self._live.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    @property
    def tombstones(self) -> int:
        """How many tombstones are kept."""
        with self._lock:
            self._prune_locked()
            return len(self._tombstones)

    def _prune_locked(self) -> None:
        horizon = self._clock() - self._ttl
        while self._tombstones:
            oldest = next(iter(self._tombstones.values()))
            if oldest.at >= horizon and len(self._tombstones) <= self._cap:
                break
            self._tombstones.popitem(last=False)
