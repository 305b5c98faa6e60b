"""The reclaimer: one task per session that watches its peer and ends it when it goes.

Started by the session transaction right after the session is inserted, with no
``await`` in between (a visible session always has an owner). It:

- appends ``session_connected`` the first time the peer connection reaches
  ``connected`` (the session moves ADMITTED -> CONNECTED);
- while connected, every :data:`ACTIVITY_TOUCH_S` records the run's activity when media
  or a consent answer arrived within that interval (a run with media flowing never reads
  as expired);
- returns when the peer is ``failed``, ``closed`` or ``disconnected``, when it ended
  cleanly (:mod:`whip.rtc.peer_end`: a DTLS close_notify, or an RTCP BYE on every
  source, which need not close aiortc's peer connection), or when it has not connected
  within ``limits.connect_timeout_s``; whatever ends the watch (an unexpected error
  included), the session is handed to ``on_gone`` (the manager closes it as
  ``peer_closed`` after a clean end, else ``peer_gone``, unless another caller already
  won it).

No lost wakeup: the change flag is cleared *before* the state is read, so a change during
any await sets it again. Cancellation: only the manager's close cancels it, after winning
the session's removal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from whip.live_session import LiveSession, SessionState

logger = logging.getLogger(__name__)

ACTIVITY_TOUCH_S = 5.0
"""While connected, the run's activity is recorded this often (media flowing)."""


class Reclaimer:
    """Starts and runs the watch of each session (module doc)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        on_connected: Callable[[LiveSession], Awaitable[None]],
        on_gone: Callable[[LiveSession], None],
        touch_run: Callable[[str], None] | None,
    ) -> None:
        """``touch_run``: moves a run's in-memory last activity (the embedded registry's
        expiry); None in cluster mode, where a run's last activity is its last durable
        event."""
        self.connect_timeout_s = connect_timeout_s
        self._on_connected = on_connected
        self._on_gone = on_gone
        self._touch_run = touch_run

    def start(self, session: LiveSession) -> asyncio.Task[None]:
        """Start watching ``session`` (call with no ``await`` after its insertion)."""
        task = asyncio.create_task(self._watch(session), name=f"reclaim-{session.session_id}")
        session.reclaimer = task
        return task

    async def _watch(self, session: LiveSession) -> None:
        changed = asyncio.Event()
        pc = session.pc

        def on_change() -> None:
            session.state_history.append(pc.connectionState)
            changed.set()

        pc.on("connectionstatechange", on_change)
        if session.peer_end is not None:
            session.peer_end.on_end(changed.set)
        deadline = time.monotonic() + self.connect_timeout_s
        try:
            while True:
                changed.clear()
                state = pc.connectionState
                if state in ("failed", "closed", "disconnected"):
                    return
                if session.peer_end is not None and session.peer_end.reason is not None:
                    return
                if state == "connected" and session.state is SessionState.ADMITTED:
                    session.advance(SessionState.CONNECTED)
                    await self._on_connected(session)
                    continue
                connected = session.state is SessionState.CONNECTED
                timeout = ACTIVITY_TOUCH_S if connected else deadline - time.monotonic()
                if not connected and timeout <= 0:
                    logger.info(
                        "session %s run %s: no connection within %.0fs",
                        session.session_id,
                        session.run_id,
                        self.connect_timeout_s,
                    )
                    return
                try:
                    async with asyncio.timeout(timeout):
                        await changed.wait()
                except TimeoutError:
                    if connected:  # a peer that never connected is not proof of life
                        self._touch_if_alive(session)
        except Exception:
            logger.exception(
                "session %s run %s: reclaimer failed", session.session_id, session.run_id
            )
        finally:
            if not session.closing:
                self._on_gone(session)

    def _touch_if_alive(self, session: LiveSession) -> None:
        """Media flowing is proof of life: keep the run from reading as expired."""
        liveness = session.liveness
        if self._touch_run is None or liveness is None:
            return
        if time.monotonic() - liveness.last_life() < ACTIVITY_TOUCH_S:
            self._touch_run(session.run_id)
