"""PATCH on a live WHIP session: trickle ICE and ICE restart, one at a time per session.

The sans-IO rules (what a PATCH is, its 428/412/400s, the answer fragment) are
:mod:`whip.trickle`'s; the restart itself is :mod:`whip.rtc.ice_restart`'s. This module
applies them to a :class:`~whip.live_session.LiveSession`. Rules:

- Serialized: every PATCH of one session runs under that session's ``patch_lock`` (FIFO),
  and its preconditions are judged inside the lock against the ETag of that moment. A
  trickle queued behind a restart is judged against the restart's new ETag (412 with the
  old one); two restarts apply one after the other, the second superseding the first.
- A close (DELETE, stop, peer end, shutdown) never takes the lock: a DELETE never waits
  behind a PATCH. A PATCH checks that the session is not closing once it holds the lock,
  and a restart swaps the credentials with no ``await`` between that check and the swap.
  So a restart is either wholly applied before the close began (the close then closes
  the connection, which ends its checks) or refused with 409 ``session_closed``; a
  trickle that meets a closing session between two candidates stops there, with the
  same 409.
- A refused restart (bad fragment, ICE not connected yet, closing) changes nothing: the
  session keeps its ICE session, ETag and candidates (RFC 9725 section 4.3.2). One that
  is applied but never selects a pair keeps the old pair; media liveness ends the
  session if that path is dead too.
- Exactly once: each applied restart appends one ``ice_restarted`` event when it settles
  (``data``: generation, outcome, ms), unless the session is closing by then (the close
  closes the connection, which settles the restart as ``closed``; it is counted, not
  recorded).
- Detached (:class:`whip.detached.DetachedTasks`): a client that hangs up mid-PATCH
  does not stop it half-way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aioice import Candidate
from aiortc.sdp import candidate_from_sdp

from registry.events import EventType
from whip.detached import DetachedTasks
from whip.errors import HttpError
from whip.live_session import LiveSession
from whip.rtc.ice_restart import (
    CredentialsChanged,
    IceRestart,
    IceRestartRefusedError,
    RemoteIce,
    RestartOutcome,
    bundle_ice_transport,
    credentials_unshared,
    ice_connection,
    restart_ice,
)
from whip.trickle import (
    CONTENT_TYPE,
    FragmentError,
    IceCredentials,
    PatchKind,
    TrickleFragment,
    answer_layout,
    check_trickle,
    classify_patch,
    new_etag,
    render_fragment,
    restart_credentials,
)

logger = logging.getLogger(__name__)

Append = Callable[[LiveSession, str, dict[str, object]], Awaitable[None]]


class SessionClosingError(HttpError):
    """The session is closing: a PATCH can change nothing any more."""

    http_status = 409
    code = "session_closed"

    def __init__(self) -> None:
        super().__init__("the session is closing")


class IceNotReadyError(HttpError):
    """An ICE restart before the first ICE session connected."""

    http_status = 409
    code = "ice_not_connected"


@dataclass(frozen=True, slots=True)
class PatchAnswer:
    """What the PATCH answers: 204 (trickle) or 200 with a fragment and a new ETag."""

    status: int
    body: str = ""
    etag: str | None = None
    content_type: str = CONTENT_TYPE


class SessionPatches:
    """Applies PATCHes to live sessions (module doc)."""

    def __init__(
        self,
        *,
        append: Append,
        detached: DetachedTasks,
        restart_timeout_s: float,
        credentials_changed: CredentialsChanged = credentials_unshared,
    ) -> None:
        self._append = append
        self._detached = detached
        self.restart_timeout_s = restart_timeout_s
        self._credentials_changed = credentials_changed
        self.restarts: dict[str, int] = dict.fromkeys((o.value for o in RestartOutcome), 0)
        """Settled ICE restarts by outcome (loop thread only)."""

    async def patch(
        self,
        session: LiveSession,
        fragment: TrickleFragment,
        if_match: str | None,
        etag_header: str | None,
    ) -> PatchAnswer:
        """Apply one PATCH (module doc).

        Cancellation: detached; the caller stops waiting, the PATCH runs to its end."""
        return await self._detached.run(
            self._serialized(session, fragment, if_match, etag_header),
            f"patch-{session.session_id}",
        )

    async def _serialized(
        self,
        session: LiveSession,
        fragment: TrickleFragment,
        if_match: str | None,
        etag_header: str | None,
    ) -> PatchAnswer:
        async with session.patch_lock:
            if session.closing:
                raise SessionClosingError()
            kind = classify_patch(if_match, etag_header, session.etag)
            if kind is PatchKind.RESTART:
                return self._restart(session, fragment)
            await self._trickle(session, fragment)
            return PatchAnswer(204)

    async def _trickle(self, session: LiveSession, fragment: TrickleFragment) -> None:
        """Apply trickled candidates to the bundle transport (the first transceiver's,
        where aiortc gathers for BUNDLE). Every line is parsed before any is applied."""
        pc = session.pc
        transceivers = pc.getTransceivers()
        if not transceivers:
            raise HttpError("session has no media", http_status=409, code="no_media")
        check_trickle(fragment, ice_connection(bundle_ice_transport(pc)).remote_username)
        mid = transceivers[0].mid
        parsed = []
        for line in fragment.candidates:
            try:
                candidate = candidate_from_sdp(line.removeprefix("candidate:"))
            except (ValueError, IndexError, AssertionError) as exc:
                raise FragmentError(f"malformed candidate: {exc}") from exc
            candidate.sdpMid = mid
            parsed.append(candidate)
        for candidate in parsed:
            if session.closing:
                raise SessionClosingError()
            await pc.addIceCandidate(candidate)
        if fragment.end_of_candidates and not session.closing:
            await pc.addIceCandidate(None)

    def _restart(self, session: LiveSession, fragment: TrickleFragment) -> PatchAnswer:
        """Restart ICE (no ``await``: checked, swapped and answered in one step)."""
        transport = bundle_ice_transport(session.pc)
        connection = ice_connection(transport)
        remote = restart_credentials(fragment, connection.remote_username)
        candidates: list[Candidate] = []
        for line in fragment.candidates:
            try:
                candidates.append(Candidate.from_sdp(line.removeprefix("candidate:")))
            except (ValueError, IndexError) as exc:
                raise FragmentError(f"malformed candidate: {exc}") from exc
        try:
            layout = answer_layout(session.answer_sdp)
        except ValueError as exc:
            raise HttpError("session has no media", http_status=409, code="no_media") from exc
        local = IceCredentials.generate()
        try:
            restart = restart_ice(
                transport,
                local,
                RemoteIce(remote, tuple(candidates), fragment.end_of_candidates),
                credentials_changed=self._credentials_changed,
                timeout_s=self.restart_timeout_s,
            )
        except IceRestartRefusedError as exc:
            raise IceNotReadyError(str(exc)) from exc
        session.ice_generation += 1
        session.ice_restart = restart
        session.etag = new_etag()
        logger.info(
            "session %s run %s: ICE restart %d applied (%d remote candidates)",
            session.session_id,
            session.run_id,
            session.ice_generation,
            len(candidates),
        )
        self._detached.detach(
            self._record(session, restart, session.ice_generation),
            f"ice-restart-{session.session_id}-{session.ice_generation}",
        )
        return PatchAnswer(200, render_fragment(local, layout), session.etag)

    async def _record(self, session: LiveSession, restart: IceRestart, generation: int) -> None:
        """Append ``ice_restarted`` once the restart settled (module doc)."""
        outcome = await restart.settled()
        self.restarts[outcome.value] += 1
        if session.closing:
            return
        waited_ms = int((time.monotonic() - restart.started) * 1000)
        await self._append(
            session,
            EventType.ICE_RESTARTED,
            {"generation": generation, "outcome": outcome.value, "ms": waited_ms},
        )
