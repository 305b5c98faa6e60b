"""One live WHIP session: its peer connection, run, permit, and its lifecycle state.

A :class:`LiveSession` is created by the session transaction
(:mod:`whip.session_manager`) once negotiation succeeded, and is owned by the manager's
table from insertion until exactly one caller wins ``remove_if_owned``. Only that winner
closes the peer connection, writes ``session_closed`` and releases the media permit.

Lifecycle (a state machine as data, h11 style): :data:`TRANSITIONS` lists every allowed
move and :meth:`LiveSession.advance` is the one function that applies one, or raises
:class:`SessionStateError` and leaves the state unchanged. CLOSED is absorbing.

- ADMITTED: inserted into the table, its reclaimer and decode workers started; the peer
  has not connected yet.
- CONNECTED: the reclaimer saw the peer connection reach ``connected`` (and appended
  ``session_connected``).
- CLOSING: the one winner of ``remove_if_owned`` is closing it (from ADMITTED or
  CONNECTED); faults reported from now on are not faults of a live session any more.
- CLOSED: the close finished (peer closed, workers joined or left detached,
  ``session_closed`` appended).

The session's ``etag`` names its current ICE session: it changes with every ICE restart
(:mod:`whip.session_patch`, under ``patch_lock``). All moves happen on the event loop
thread. ``lifecycle`` records every state the session
went through, ``state_history`` every connection state of its peer (tests assert both
whole).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline.analysis import Analysis
from pipeline.intake import FrameIntake
from pipeline.recording.recorder import SessionRecorder
from pipeline.supervisor import Supervisor
from whip.admission import MediaPermit
from whip.rtc.ice_restart import IceRestart
from whip.rtc.liveness import Liveness
from whip.rtc.peer_end import PeerEnd

logger = logging.getLogger(__name__)


class CloseReason(StrEnum):
    """``session_closed.reason`` values of ARCHITECTURE.md."""

    DELETED = "deleted"
    STOPPED = "stopped"
    PEER_CLOSED = "peer_closed"
    """The peer ended cleanly: DTLS close_notify, or an RTCP BYE on every source."""
    PEER_GONE = "peer_gone"
    """Silence, consent or ICE failure, or no connection within the deadline."""
    SUPERSEDED = "superseded"
    FAULT = "fault"
    SHUTDOWN = "shutdown"
    FENCED = "fenced"
    """Cluster mode: the node lost its lease, so it stops owning its sessions."""


class SessionState(StrEnum):
    ADMITTED = "admitted"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.ADMITTED: frozenset({SessionState.CONNECTED, SessionState.CLOSING}),
    SessionState.CONNECTED: frozenset({SessionState.CLOSING}),
    SessionState.CLOSING: frozenset({SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class SessionStateError(RuntimeError):
    """A lifecycle move :data:`TRANSITIONS` does not allow (a bug of ours)."""

    http_status = 500
    code = "internal"


@dataclass(eq=False, slots=True)
class LiveSession:
    """A live session. Identity matters (remove-if-owned compares entries by ``is``)."""

    session_id: str
    run_id: str
    principal: str
    stream: str
    pc: Any
    permit: MediaPermit
    etag: str
    posted_at: float
    liveness: Liveness | None = None
    peer_end: PeerEnd | None = None
    answer_sdp: str = ""
    """The answer the 201 carried (an ICE restart's answer repeats its candidates)."""
    patch_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serializes this session's PATCHes (:mod:`whip.session_patch`)."""
    ice_generation: int = 0
    """ICE restarts applied so far."""
    ice_restart: IceRestart | None = None
    """The newest ICE restart, running or settled."""
    intakes: list[FrameIntake] = field(default_factory=list)
    supervisor: Supervisor | None = None
    analysis: Analysis | None = None
    recorder: SessionRecorder | None = None
    """The session's recorder when its pushes are recorded (:mod:`whip.recordings`)."""
    reclaimer: asyncio.Task[None] | None = None
    created_at: float = field(default_factory=time.monotonic)
    state: SessionState = SessionState.ADMITTED
    lifecycle: list[SessionState] = field(default_factory=lambda: [SessionState.ADMITTED])
    """Every lifecycle state, in order."""
    state_history: list[str] = field(default_factory=list)
    """Every connection state the peer went through, in order."""

    def advance(self, new: SessionState) -> None:
        """Move to ``new`` or raise :class:`SessionStateError` (state unchanged)."""
        if new not in TRANSITIONS[self.state]:
            raise SessionStateError(f"session {self.session_id}: {self.state} -> {new}")
        logger.debug("session %s run %s: %s -> %s", self.session_id, self.run_id, self.state, new)
        self.state = new
        self.lifecycle.append(new)

    @property
    def connected(self) -> bool:
        """The peer connected at some point (it may be closing now)."""
        return SessionState.CONNECTED in self.lifecycle

    @property
    def closing(self) -> bool:
        """The close has begun (CLOSING or CLOSED)."""
        return self.state in (SessionState.CLOSING, SessionState.CLOSED)
