"""One live WHIP session: its peer connection, run, permit and how it ends.

A :class:`WhipSession` is created by the session transaction and is owned by the
:class:`whip.sessions.SessionManager`'s table from insertion until exactly one caller
wins ``remove_if_owned``. Only that winner closes the peer connection, writes
``session_closed`` and releases the media permit.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline.analysis import Analysis
from pipeline.intake import FrameIntake
from pipeline.supervisor import Supervisor
from whip.admission import MediaPermit
from whip.rtc.liveness import Liveness


class CloseReason(StrEnum):
    """``session_closed.reason`` values of ARCHITECTURE.md."""

    DELETED = "deleted"
    STOPPED = "stopped"
    PEER_GONE = "peer_gone"
    SUPERSEDED = "superseded"
    FAULT = "fault"
    SHUTDOWN = "shutdown"


@dataclass(eq=False, slots=True)
class WhipSession:
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
    intakes: list[FrameIntake] = field(default_factory=list)
    runtime: Supervisor | None = None
    analysis: Analysis | None = None
    connected: bool = False
    reclaimer: asyncio.Task[None] | None = None
    closing: bool = False
    created_at: float = field(default_factory=time.monotonic)
    state_history: list[str] = field(default_factory=list)
    """Every connection state the peer went through, in order (tests assert it whole)."""
