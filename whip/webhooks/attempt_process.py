"""The webhooks' HTTP attempts in a child process: the HTTP client off the server's GIL.

Why: a delivery attempt costs its loop about a hundred microseconds of CPU in the HTTP
client (:mod:`whip.webhooks.http_client`: request, connection, response parser; it was a
few hundred with aiohttp's); everything else a delivery does (the warm read, the body,
the signature, the cursor) is less than that. On the
delivery thread those microseconds are spent holding the GIL that the appends'
confirmations need, in bursts of one request per webhook for each wanted event. Here the
child process spends them on its own interpreter; the delivery thread only writes a
request frame and reads an answer frame.

Rules:

- What moves is :func:`whip.webhooks.delivery.attempt`, unchanged: one bounded POST and
  its :class:`~whip.webhooks.delivery.Attempt`. Everything that decides what is sent,
  when, and what the cursor may pass stays with the dispatchers, in the server's
  process (:mod:`whip.webhooks.dispatcher`): the child reads no timeline and keeps no
  state but its HTTP clients, so cursor semantics, order per run, at-least-once, the
  status and the metrics are the dispatchers' as before.
- One child per :class:`AttemptProcess` (one per delivery loop), started by
  :meth:`AttemptProcess.start` (or the first attempt); in it, one HTTP client per
  webhook name with that webhook's connection limit
  (:func:`~whip.webhooks.delivery.new_http_session`), so a slow receiver still holds up
  only its own webhook.
- Started, connected and framed as :mod:`whip.webhooks.child_pipes` says. Requests:
  ``{"op": "post", "id", "hook", "parallel", "url", "headers", "timeout"}`` with the
  signed body; ``{"op": "cancel", "id"}``.
  Answers: ``{"id", "outcome", "status", "error"}``; first of all, once its loop runs,
  the child says ``{"id": 0}`` (ready).
- The child dies with the server: it exits when its stdin closes (the server closed it,
  or exited, SIGKILL included). A child that dies under the server fails every attempt
  in flight as an ``error`` (the dispatchers retry them with backoff, as any failure);
  the next attempt starts a new child (logged).
- Cancellation: an attempt cancelled in the server is cancelled in the child too (its
  connection closed, as :func:`~whip.webhooks.delivery.attempt` does); :meth:`aclose`
  closes the child's stdin and waits for it to exit (killed after
  :data:`EXIT_DEADLINE_S`).
- Loop-only: an :class:`AttemptProcess` is used on the loop that started it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
from typing import Any, Final

from whip.eventloop import EventLoopKind, new_event_loop
from whip.webhooks.child_pipes import (
    FrameReader,
    answers_out,
    frame,
    requests_in,
    spawn,
    wait_or_kill,
)
from whip.webhooks.config import WebhookConfig
from whip.webhooks.delivery import OUTCOMES, Attempt, attempt, new_http_session
from whip.webhooks.http_client import HttpClient

logger = logging.getLogger(__name__)

EXIT_DEADLINE_S: Final = 5.0
START_DEADLINE_S: Final = 30.0
"""Bound on a child's start, to its ready frame (the imports on a loaded host)."""


class _ChildProtocol(asyncio.Protocol):
    """One child's stdout cut into answer frames; at its end (EOF: the child exited or is
    exiting) the child is reaped, then :attr:`exited` is set."""

    def __init__(self, owner: AttemptProcess, proc: subprocess.Popen[bytes]) -> None:
        self._owner = owner
        self.proc = proc
        self._frames = FrameReader(owner._answered, lambda: None)
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reaper: asyncio.Task[None] | None = None

    def data_received(self, data: bytes) -> None:
        self._frames.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        await asyncio.to_thread(wait_or_kill, self.proc, EXIT_DEADLINE_S)
        if not self.exited.done():
            self.exited.set_result(None)
        self._owner._ended(self)


class AttemptProcess:
    """The child that makes the HTTP attempts of one loop's webhooks (module rules)."""

    def __init__(self, kind: EventLoopKind) -> None:
        self._kind = kind
        self._protocol: _ChildProtocol | None = None
        self._writer: asyncio.WriteTransport | None = None
        self._pending: dict[int, asyncio.Future[Attempt]] = {}
        self._next_id = 0
        self._starting: asyncio.Lock | None = None
        self._ready: asyncio.Future[None] | None = None
        self._closing = False
        self.pid: int | None = None
        """The child's process id (the last one started; None before the first)."""
        self.starts = 0
        """Children started (a restart after a child died counts one more)."""
        self.attempts = 0
        """Attempts sent to a child."""

    async def start(self) -> None:
        """Start the child now and wait until it is ready (else the first attempt does).

        Cancellation: a child being started is left to the next attempt or :meth:`aclose`.
        """
        await self._ensure_started()

    async def _ensure_started(self) -> asyncio.WriteTransport:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            if self._closing:
                raise RuntimeError("the webhook attempt process is closed")
            ready = self._ready = asyncio.get_running_loop().create_future()
            protocol, writer = await spawn(
                "whip.webhooks.attempt_process", self._kind, lambda p: _ChildProtocol(self, p)
            )
            proc = protocol.proc
            self._protocol = protocol
            self.pid = proc.pid
            self.starts += 1
            self._writer = writer
            try:
                async with asyncio.timeout(START_DEADLINE_S):
                    await ready
            except TimeoutError:
                proc.kill()
                raise OSError(
                    f"the webhook attempt process {proc.pid} was not ready within"
                    f" {START_DEADLINE_S} s (killed)"
                ) from None
            logger.info("webhook attempt process %d started", self.pid)
            return writer

    def _answered(self, header: dict[str, Any], _body: bytes) -> None:
        if header["id"] == 0:
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
            return
        future = self._pending.pop(header["id"], None)
        if future is None or future.done():
            return
        outcome = header["outcome"]
        if outcome not in OUTCOMES:
            outcome, header["error"] = "error", f"unknown outcome {outcome!r}"
        future.set_result(Attempt(outcome, header["status"], header["error"]))

    def _ended(self, protocol: _ChildProtocol) -> None:
        """The child exited: every attempt in flight failed."""
        if protocol is not self._protocol:
            return
        writer = self._writer
        pid = self.pid
        self._writer = None
        self._protocol = None
        if writer is not None:
            writer.close()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(OSError("the webhook attempt process exited at start"))
        pending, self._pending = self._pending, {}
        if not self._closing:
            logger.error(
                "webhook attempt process %s exited under the server; %d attempts in flight "
                "failed (retried), the next attempt starts a new one",
                pid,
                len(pending),
            )
        for future in pending.values():
            if not future.done():
                future.set_result(Attempt("error", error="the webhook attempt process exited"))

    async def attempt(
        self, webhook: WebhookConfig, body: bytes, headers: dict[str, str]
    ) -> Attempt:
        """POST ``body`` once, in the child (module rules). Never raises for what the
        receiver or the child does.

        Cancellation: the attempt is cancelled in the child too.
        """
        try:
            writer = await self._ensure_started()
        except (OSError, RuntimeError) as exc:
            return Attempt("error", error=f"webhook attempt process: {exc!r}"[:200])
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[Attempt] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        header = {
            "op": "post",
            "id": request_id,
            "hook": webhook.name,
            "parallel": webhook.max_parallel_runs,
            "url": webhook.url,
            "headers": headers,
            "timeout": webhook.timeout_s,
        }
        writer.write(frame(header, body))
        self.attempts += 1
        try:
            return await future
        except asyncio.CancelledError:
            self._pending.pop(request_id, None)
            if self._writer is writer and not writer.is_closing():
                writer.write(frame({"op": "cancel", "id": request_id}))
            raise

    async def aclose(self) -> None:
        """Close the child's stdin, wait for it to exit (killed after
        :data:`EXIT_DEADLINE_S`) (idempotent).

        Cancellation: the child is killed.
        """
        self._closing = True
        protocol, writer = self._protocol, self._writer
        if protocol is None:
            return
        if writer is not None:
            writer.close()
        try:
            async with asyncio.timeout(EXIT_DEADLINE_S):
                await asyncio.shield(protocol.exited)
        except TimeoutError:
            logger.error("webhook attempt process %s did not exit; killed", self.pid)
        finally:
            if not protocol.exited.done():
                protocol.proc.kill()
                await asyncio.shield(protocol.exited)


# ---------------------------------------------------------------------- the child


async def serve() -> None:
    """The child: attempts from stdin, answers on stdout, until stdin closes."""
    loop = asyncio.get_running_loop()
    sessions: dict[str, HttpClient] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    ended = asyncio.Event()
    writer = await answers_out(loop)

    async def post(header: dict[str, Any], body: bytes) -> None:
        hook = header["hook"]
        http = sessions.get(hook)
        if http is None:
            http = sessions[hook] = new_http_session(header["parallel"])
        result = await attempt(http, header["url"], body, header["headers"], header["timeout"])
        answer = {"id": header["id"], "outcome": result.outcome}
        writer.write(frame({**answer, "status": result.status, "error": result.error}))

    def on_frame(header: dict[str, Any], body: bytes) -> None:
        request_id = header["id"]
        if header["op"] == "cancel":
            task = tasks.get(request_id)
            if task is not None:
                task.cancel()
            return
        task = asyncio.create_task(post(header, body), name=f"webhook-attempt-{request_id}")
        tasks[request_id] = task
        task.add_done_callback(lambda _: tasks.pop(request_id, None))

    await requests_in(loop, FrameReader(on_frame, ended.set))
    writer.write(frame({"id": 0}))
    await ended.wait()
    for task in list(tasks.values()):
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    for http in sessions.values():
        await http.close()
    writer.close()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the server's
    kind: EventLoopKind = "asyncio" if argv[1:] == ["asyncio"] else "uvloop"
    loop = new_event_loop(kind)
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


if __name__ == "__main__":
    main(sys.argv)
