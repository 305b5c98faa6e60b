"""ICE restart on a live aioice ``Connection`` (RFC 8445 section 9, RFC 9725 section 4.3.2).

aioice and aiortc cannot restart ICE: a ``Connection`` runs ``connect()`` once. This module
restarts it in place, for either role (the server as ICE-controlled answerer, the tests'
aiortc publishers as controlling offerer):

- :func:`restart_ice` swaps, with no ``await`` (atomically on the event loop), the local
  and remote credentials, forgets the remote candidates and starts a fresh check list;
  then a task of its own adds the new remote candidates and paces checks as
  ``connect()`` does. Only the ``_nominated`` pair is kept: DTLS and SRTP keep sending over
  it until a pair of the new generation is nominated for every component, which then
  replaces it (aioice's ``check_complete`` does the replacing). Consent checks carry on
  over whichever pair is nominated, with the new credentials.
- Completion is judged on the new generation only: while a restart runs, the
  connection's ``_check_list_maybe_complete`` is shadowed per instance (aioice's own
  version would see the kept pair and report completion at once): complete once every
  component of the kept pairs has a nominated pair that is not the kept one. The
  components stay those of the kept pairs (an ``a=end-of-candidates`` with no candidate,
  as a peer that is learned peer-reflexive sends, must not prune them).
- The outcome (:class:`RestartOutcome`) is one of: completed, timed out (the old pair is
  kept; consent or media liveness ends the session if the path is really gone, RFC 9725
  4.3.2), superseded (a newer restart replaced it), closed (the connection closed).
- ``credentials_changed(connection)`` runs right after the swap (a shared UDP socket
  re-registers the new local ufrag there); it defaults to nothing.

Ownership: a connection has at most one restart running (module table, weakly keyed);
a newer restart cancels the older one before it swaps anything. The caller serializes
restarts of one connection (the server's session PATCH lock) and never starts one
before ``connect()`` finished (:class:`IceRestartRefusedError`).

aioice internals touched (checked by :func:`internals_problems`): ``Connection``
``_local_username``, ``_local_password``, ``_remote_candidates``,
``_remote_candidates_end``, ``_check_list``, ``_check_list_done``, ``_check_list_state``,
``_nominated``, ``_nominating``, ``_components``, ``_closing``, ``_unfreeze_initial``,
``_check_periodic``, ``_check_list_maybe_complete`` (shadowed per instance); aiortc's
``RTCIceTransport._connection`` and ``RTCIceGatherer._remote_candidates_end``.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
import aiortc.rtcicetransport
from aioice import Candidate

from whip.trickle import IceCredentials

logger = logging.getLogger(__name__)

CHECK_PACE_S = 0.02
"""Pace of the new generation's checks (aioice's ``connect()`` uses the same Ta)."""
DEFAULT_TIMEOUT_S = 30.0
"""How long a restart may take to nominate a new pair before it is given up."""

CredentialsChanged = Callable[[aioice.ice.Connection], None]


def credentials_unshared(connection: aioice.ice.Connection) -> None:
    """The default ``credentials_changed``: no shared socket to tell."""


class IceRestartRefusedError(RuntimeError):
    """The connection cannot restart now (not connected yet, or closing); nothing was
    changed."""


@dataclass(frozen=True, slots=True)
class RemoteIce:
    """What the other side sent for the new generation."""

    credentials: IceCredentials
    candidates: tuple[Candidate, ...] = ()
    end_of_candidates: bool = False


class RestartOutcome(enum.StrEnum):
    COMPLETED = "completed"
    TIMED_OUT = "timed_out"
    SUPERSEDED = "superseded"
    CLOSED = "closed"


@dataclass(eq=False, slots=True)
class IceRestart:
    """One restart in progress (or settled) on one connection."""

    connection: aioice.ice.Connection
    local: IceCredentials
    started: float = field(default_factory=time.monotonic)
    selected: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a new-generation pair is nominated for every component."""
    task: asyncio.Task[RestartOutcome] | None = None

    async def settled(self) -> RestartOutcome:
        """Wait for the outcome (``superseded`` for a restart cancelled before its task
        began). Cancellation: only this wait is cancelled."""
        assert self.task is not None
        try:
            return await asyncio.shield(self.task)
        except asyncio.CancelledError:
            if self.task.cancelled():
                return RestartOutcome.SUPERSEDED
            raise

    def cancel(self) -> None:
        """Stop this restart's checks (its outcome becomes ``superseded``)."""
        if self.task is not None:
            self.task.cancel()


_running: weakref.WeakKeyDictionary[aioice.ice.Connection, IceRestart] = weakref.WeakKeyDictionary()


def bundle_ice_transport(pc: Any) -> Any:
    """The ``RTCIceTransport`` of ``pc``'s bundle (its first transceiver's, where aiortc
    gathers for BUNDLE)."""
    return pc.getTransceivers()[0].receiver.transport.transport


def ice_connection(transport: Any) -> aioice.ice.Connection:
    """The aioice connection of an aiortc ``RTCIceTransport``."""
    connection: aioice.ice.Connection = transport._connection
    return connection


def restart_ice(
    transport: Any,
    local: IceCredentials,
    remote: RemoteIce,
    *,
    credentials_changed: CredentialsChanged = credentials_unshared,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> IceRestart:
    """Restart ICE on the aiortc ``RTCIceTransport`` ``transport`` (module doc).

    Raises :class:`IceRestartRefusedError` (nothing changed) if its connection has not
    connected yet or is closing. Returns the running :class:`IceRestart`; its task ends
    by itself (bounded by ``timeout_s``) and when the connection closes.
    """
    connection: Any = ice_connection(transport)  # private state is written below
    if connection._closing:
        raise IceRestartRefusedError("the ICE connection is closing")
    if not connection._nominated:
        raise IceRestartRefusedError("ICE has not connected yet")
    previous = _running.pop(connection, None)
    if previous is not None:
        previous.cancel()
    kept = dict(connection._nominated)
    for pair in connection._check_list:
        if pair.task is not None:
            pair.task.cancel()
    # The swap: no await from here to the task's creation.
    connection._local_username = local.ufrag
    connection._local_password = local.pwd
    connection.remote_username = remote.credentials.ufrag
    connection.remote_password = remote.credentials.pwd
    connection._remote_candidates = []
    connection._remote_candidates_end = False
    connection._check_list = []
    connection._check_list_done = False
    connection._check_list_state = asyncio.Queue()
    connection._nominating = set()
    connection._components = set(kept)  # never pruned again: these carry the media
    transport.iceGatherer._remote_candidates_end = False
    restart = IceRestart(connection, local)
    connection._check_list_maybe_complete = _new_generation_complete(connection, kept, restart)
    _running[connection] = restart
    credentials_changed(connection)
    restart.task = asyncio.create_task(
        _run(transport, restart, remote, timeout_s), name=f"ice-restart-{local.ufrag}"
    )
    logger.info(
        "%s: ICE restart, local ufrag %s, remote ufrag %s, %d remote candidates",
        connection,
        local.ufrag,
        remote.credentials.ufrag,
        len(remote.candidates),
    )
    return restart


def _new_generation_complete(
    connection: Any, kept: dict[int, Any], restart: IceRestart
) -> Callable[[], bool]:
    """``_check_list_maybe_complete`` while a restart runs: complete once every component
    has a nominated pair that is not the kept one."""

    def maybe_complete() -> bool:
        nominated = connection._nominated
        if any(nominated.get(c) is None or nominated.get(c) is pair for c, pair in kept.items()):
            return False
        if not connection._check_list_done:
            connection._check_list_done = True
            connection._check_list_state.put_nowait(aioice.ice.ICE_COMPLETED)
        restart.selected.set()
        return True

    return maybe_complete


async def _run(
    transport: Any, restart: IceRestart, remote: RemoteIce, timeout_s: float
) -> RestartOutcome:
    """Add the new remote candidates, pace the checks, wait for the new pair.

    Cancellation: the restart is superseded; the connection keeps whatever pair is
    nominated."""
    connection = restart.connection
    outcome = RestartOutcome.TIMED_OUT
    try:
        async with asyncio.timeout(timeout_s):
            for candidate in remote.candidates:
                await connection.add_remote_candidate(candidate)
            if remote.end_of_candidates:
                # Not add_remote_candidate(None): that would prune the components the
                # new candidates do not name, and a restart fragment may name none (the
                # peer is then learned as peer-reflexive from its checks).
                transport.iceGatherer._remote_candidates_end = True
                connection._remote_candidates_end = True
            connection._unfreeze_initial()
            while not restart.selected.is_set() and not connection._closing:
                if not connection._check_list_done:
                    connection._check_periodic()
                await asyncio.sleep(CHECK_PACE_S)
        outcome = RestartOutcome.CLOSED if connection._closing else RestartOutcome.COMPLETED
    except TimeoutError:
        outcome = RestartOutcome.CLOSED if connection._closing else RestartOutcome.TIMED_OUT
    except asyncio.CancelledError:
        outcome = RestartOutcome.SUPERSEDED
    finally:
        if _running.get(connection) is restart:  # else a newer restart owns the state
            del _running[connection]
            vars(connection).pop("_check_list_maybe_complete", None)
            connection._check_list_done = True
            for pair in connection._check_list:  # as connect() ends its remaining checks
                if pair.task is not None:
                    pair.task.cancel()
    logger.info(
        "%s: ICE restart %s (%s) after %.0f ms",
        connection,
        restart.local.ufrag,
        outcome.value,
        (time.monotonic() - restart.started) * 1000,
    )
    return outcome


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    connection = aioice.ice.Connection
    init = inspect.getsource(connection.__init__)
    for name in (
        "_local_username",
        "_local_password",
        "_remote_candidates",
        "_remote_candidates_end",
        "_check_list",
        "_check_list_done",
        "_check_list_state",
        "_nominated",
        "_nominating",
        "_components",
        "_closing",
        "remote_username",
        "remote_password",
    ):
        if f"self.{name} " not in init and f"self.{name}:" not in init:
            problems.append(f"aioice.ice.Connection.{name}")
    for name in ("_unfreeze_initial", "_check_periodic", "_check_list_maybe_complete"):
        if not callable(getattr(connection, name, None)):
            problems.append(f"aioice.ice.Connection.{name}")
    complete = inspect.getsource(connection.check_complete)
    if "self._nominated[pair.component] = pair" not in complete:
        problems.append("aioice.ice.Connection.check_complete replaces _nominated")
    if "self._check_list_maybe_complete()" not in complete:
        problems.append("aioice.ice.Connection.check_complete asks _check_list_maybe_complete")
    for name in ("local_username", "local_password"):
        prop = getattr(connection, name, None)
        if not isinstance(prop, property) or prop.fget is None:
            problems.append(f"aioice.ice.Connection.{name} property")
        elif f"self._{name}" not in inspect.getsource(prop.fget):
            problems.append(f"aioice.ice.Connection.{name} reads _{name}")
    if not hasattr(aioice.ice, "ICE_COMPLETED"):
        problems.append("aioice.ice.ICE_COMPLETED")
    transport_init = inspect.getsource(aiortc.rtcicetransport.RTCIceTransport.__init__)
    if "self._connection = gatherer._connection" not in transport_init:
        problems.append("aiortc RTCIceTransport._connection")
    gatherer_init = inspect.getsource(aiortc.rtcicetransport.RTCIceGatherer.__init__)
    if "self._remote_candidates_end" not in gatherer_init:
        problems.append("aiortc RTCIceGatherer._remote_candidates_end")
    return problems
