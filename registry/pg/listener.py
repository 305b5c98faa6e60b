"""LISTEN/NOTIFY for one node: long-poll wakeups and control messages to run owners.

Rules:

- One dedicated connection (not from the pool) LISTENs on ``whip_events`` (payload: a run
  id; sent by every batch at COMMIT, :mod:`registry.pg.batches`) and ``whip_control``
  (payload ``node<TAB>action<TAB>run_id``: a stop or delete on some node asking the run's
  owner to close its session).
- **No lost wakeup.** A long-poller registers its future in the :class:`WaitHub` *before*
  it reads; a batch's NOTIFY is delivered only after its COMMIT. So an event the read
  missed committed after the read began, and its notification reaches the listener after
  the registration. A notification lost with a broken connection is covered by rule 3.
- **Reconnect.** When the connection drops, the task reconnects with backoff (50 ms to 1 s);
  once LISTENing again it wakes *every* registered waiter (each re-reads: whatever it
  missed is in the store) and calls ``on_reconnect`` (the owner re-checks the runs it owns,
  so a control message lost in the gap cannot leave a session running).
- Callbacks run on the loop; ``on_control`` must not block.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from registry.pg.batches import EVENTS_CHANNEL
from registry.pg.committer import CONNECTION_ERRORS, RETRY_FIRST_S, RETRY_MAX_S
from registry.waiters import WaitHub

logger = logging.getLogger(__name__)

CONTROL_CHANNEL = "whip_control"


def control_payload(node_id: str, action: str, run_id: str) -> str:
    return f"{node_id}\t{action}\t{run_id}"


class StoreListener:
    """The node's LISTEN connection and its reconnect loop (see the module rules)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        node_id: str,
        waiters: WaitHub,
        *,
        on_control: Callable[[str, str], None] | None = None,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._connect = connect
        self._node_id = node_id
        self._waiters = waiters
        self._on_control = on_control
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self.listening = asyncio.Event()
        """Set while the LISTEN connection is up."""
        self.reconnects = 0

    async def start(self) -> None:
        """Connect and LISTEN (raises if the store is unreachable), then watch the link."""
        await self._listen()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="whip-pg-listen")

    async def _listen(self) -> None:
        conn = await asyncio.wait_for(self._connect(), 5.0)
        self._lost.clear()
        conn.add_termination_listener(self._on_terminated)
        await conn.add_listener(EVENTS_CHANNEL, self._on_event)
        await conn.add_listener(CONTROL_CHANNEL, self._on_control_message)
        self._conn = conn
        self.listening.set()

    def _on_terminated(self, conn: object) -> None:
        self.listening.clear()
        self._lost.set()

    def _on_event(self, conn: object, pid: int, channel: str, payload: str) -> None:
        self._waiters.notify((payload,))

    def _on_control_message(self, conn: object, pid: int, channel: str, payload: str) -> None:
        node_id, _, rest = payload.partition("\t")
        action, _, run_id = rest.partition("\t")
        if node_id != self._node_id or self._on_control is None:
            return
        self._on_control(action, run_id)

    async def _run(self) -> None:
        while True:
            await self._lost.wait()
            await self._drop()
            delay = RETRY_FIRST_S
            while True:
                try:
                    await self._listen()
                    break
                except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                    logger.warning("cluster store: LISTEN reconnect failed: %r", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
            self.reconnects += 1
            logger.info("cluster store: LISTEN connection back (reconnect %d)", self.reconnects)
            self._waiters.notify_all()
            if self._on_reconnect is not None:
                await self._on_reconnect()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        """Stop watching and close the connection (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        conn, self._conn = self._conn, None
        self.listening.clear()
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), 2.0)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError):
                conn.terminate()
