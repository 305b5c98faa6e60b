"""The webhooks' child processes and the server: how one is started, and the frames on
its stdin and stdout.

Rules (what :mod:`whip.webhooks.attempt_process` and :mod:`whip.webhooks.delivery_process`
share):

- A child is ``python -m <module> <loop kind>``, started by :func:`spawn` with
  :class:`subprocess.Popen`, not the loop's ``subprocess_exec``: the server starts it while
  other threads run, and uvloop's forked child once hung between fork and exec, on a futex
  (seen in a full test run; most likely a lock held at fork time). Popen's child runs only
  C between fork and exec. :func:`spawn` connects both pipes to the server's loop; a child
  whose pipes could not be connected is killed and reaped.
- Frames both ways (:func:`frame`, :class:`FrameReader`): a 4-byte big-endian header
  length, a 4-byte body length, the header (JSON), the body (raw bytes).
- In the child, :func:`requests_in` and :func:`answers_out` give stdin and stdout to its
  loop as a pipe, or as the socket that uvloop's (libuv's) parent hands it, whose other
  side the parent shuts (a pipe transport would take that for the reader's exit and
  close). The child exits when its stdin ends: the server closed it, exited, or was
  SIGKILLed.
- :func:`wait_or_kill` reaps a child whose stdout ended: it exits on its own, else it is
  killed after the deadline (blocking: run it in a thread).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any, Final

import orjson

from whip.eventloop import EventLoopKind

_LENGTHS: Final = struct.Struct(">II")


def frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame (module rules)."""
    encoded = orjson.dumps(header)
    return _LENGTHS.pack(len(encoded), len(body)) + encoded + body


class FrameReader(asyncio.Protocol):
    """Cuts a byte stream into frames; hands each to ``on_frame``, and EOF to ``on_end``."""

    def __init__(
        self, on_frame: Callable[[dict[str, Any], bytes], None], on_end: Callable[[], None]
    ) -> None:
        self._buffer = bytearray()
        self._on_frame = on_frame
        self._on_end = on_end

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        size = _LENGTHS.size
        while len(buffer) - start >= size:
            header_len, body_len = _LENGTHS.unpack_from(buffer, start)
            end = start + size + header_len + body_len
            if len(buffer) < end:
                break
            header = orjson.loads(bytes(buffer[start + size : start + size + header_len]))
            self._on_frame(header, bytes(buffer[start + size + header_len : end]))
            start = end
        del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_end()


async def spawn[P: asyncio.Protocol](
    module: str, kind: EventLoopKind, make_protocol: Callable[[subprocess.Popen[bytes]], P]
) -> tuple[P, asyncio.WriteTransport]:
    """Start ``python -m module kind``; its stdout feeds the protocol made for it; the
    writer is its stdin (module rules). Cancellation: a child being connected is killed
    and reaped."""
    loop = asyncio.get_running_loop()
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", module, kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    protocol = make_protocol(proc)
    try:
        writer, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
        await loop.connect_read_pipe(lambda: protocol, proc.stdout)
    except BaseException:
        proc.kill()
        await asyncio.to_thread(proc.wait)
        raise
    return protocol, writer


def wait_or_kill(proc: subprocess.Popen[bytes], deadline_s: float) -> int:
    """Reap a child whose stdout ended; killed after ``deadline_s`` (blocking)."""
    try:
        return proc.wait(deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class _WriteOnly(asyncio.Protocol):
    def eof_received(self) -> bool:
        return True  # the server never writes here; its end is shut for writing


async def answers_out(loop: asyncio.AbstractEventLoop) -> asyncio.WriteTransport:
    """The child's stdout as a transport (module rules)."""
    if stat.S_ISSOCK(os.fstat(1).st_mode):
        out = socket.socket(fileno=os.dup(1))
        transport, _ = await loop.connect_accepted_socket(_WriteOnly, out)
        return transport
    writer, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
    return writer


async def requests_in(loop: asyncio.AbstractEventLoop, reader: FrameReader) -> None:
    """Feed the child's stdin to ``reader`` (module rules)."""
    if stat.S_ISSOCK(os.fstat(0).st_mode):
        requests = socket.socket(fileno=os.dup(0))
        await loop.connect_accepted_socket(lambda: reader, requests)
    else:
        await loop.connect_read_pipe(lambda: reader, sys.stdin.buffer)
