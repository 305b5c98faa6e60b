"""A TCP proxy on loopback between PostgreSQL clients and the server that loses COMMIT
answers on purpose: the server commits, the client never hears it.

:class:`CommitCutter` relays bytes both ways and reads the PostgreSQL wire protocol (v3)
as it goes: the client's untyped start-up messages, then typed ones (a type byte and a
length). Each connection notes the statements it prepared (``Parse``) and which of them
it binds (``Bind``) or sends as simple queries (``Query``); a transaction that ran a
statement containing :attr:`CommitCutter.marker` is *marked*. While armed, the ``COMMIT``
of a marked transaction is forwarded to the server, the server's answer is read up to its
``ReadyForQuery`` (so the COMMIT is known to be done) and dropped, and both sides of that
connection are cut: the client sees its connection break with the outcome unknown.

Rules: one task per direction per connection, all closed by :meth:`CommitCutter.close`;
only connections through this proxy are touched. Clients must connect without TLS
(``sslmode=disable``), or the proxy could not read the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from urllib.parse import urlsplit, urlunsplit

HOST = "127.0.0.1"
_NEGOTIATION_CODES = {80877103, 80877104}  # SSLRequest, GSSENCRequest


def proxied_url(store: str, port: int) -> str:
    """``store`` (a ``postgresql://`` URL) reaching its server through ``port`` instead,
    without TLS."""
    parts = urlsplit(store)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{HOST}:{port}" if credentials else f"{HOST}:{port}"
    query = "&".join(filter(None, (parts.query, "sslmode=disable")))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


async def _read_typed(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readexactly(5)
    (length,) = struct.unpack("!I", head[1:])
    return head, await reader.readexactly(length - 4)


class _Link:
    """One client connection and its server connection."""

    def __init__(self, cutter: CommitCutter) -> None:
        self.cutter = cutter
        self.statements: dict[bytes, bytes] = {}
        self.marked = False
        self.cutting = asyncio.Event()

    def _uses_marker(self, kind: bytes, body: bytes) -> bool:
        marker = self.cutter.marker
        if kind == b"P":
            name, query, _ = body.split(b"\0", 2)
            self.statements[name] = query
            return False  # prepared, not yet run
        if kind == b"B":
            _portal, statement, _ = body.split(b"\0", 2)
            return marker in self.statements.get(statement, b"")
        return kind == b"Q" and marker in body

    async def client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:  # start-up: untyped messages until the StartupMessage
            head = await reader.readexactly(4)
            (length,) = struct.unpack("!I", head)
            body = await reader.readexactly(length - 4)
            writer.write(head + body)
            if struct.unpack("!I", body[:4])[0] not in _NEGOTIATION_CODES:
                break
        while True:
            head, body = await _read_typed(reader)
            kind = head[:1]
            self.marked = self.marked or self._uses_marker(kind, body)
            if kind == b"Q":
                text = body.rstrip(b"\0").strip().upper()
                if text.startswith((b"COMMIT", b"ROLLBACK", b"END", b"ABORT")):
                    cut = text.startswith((b"COMMIT", b"END")) and self.marked
                    self.marked = False
                    if cut and self.cutter.armed > 0:
                        self.cutter.armed -= 1
                        self.cutting.set()
                        writer.write(head + body)
                        await writer.drain()
                        return  # the server side reads its answer and cuts
            writer.write(head + body)
            await writer.drain()

    async def server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            head, body = await _read_typed(reader)
            if self.cutting.is_set():
                if head[:1] == b"Z":  # the COMMIT's answer is complete: drop it, cut
                    self.cutter.cuts += 1
                    return
                continue
            writer.write(head + body)
            await writer.drain()


class CommitCutter:
    """The proxy (module doc): ``await start()``, point clients at :attr:`port`,
    ``arm(n)`` to lose the next ``n`` marked COMMIT answers; :attr:`cuts` counts them."""

    def __init__(self, upstream_port: int, marker: bytes) -> None:
        self.upstream_port = upstream_port
        self.marker = marker
        self.armed = 0
        self.cuts = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def arm(self, count: int) -> None:
        self.armed += count

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server_w: asyncio.StreamWriter | None = None
        try:
            server_r, server_w = await asyncio.open_connection(HOST, self.upstream_port)
            link = _Link(self)
            async with asyncio.TaskGroup() as group:
                group.create_task(link.client_to_server(client_r, server_w), name="pg-cut-up")
                down = group.create_task(
                    link.server_to_client(server_r, client_w), name="pg-cut-down"
                )
                await down  # a cut, or the server closed: end both directions
                raise _LinkOver
        except* (_LinkOver, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for stream in (client_w, server_w):
                if stream is not None:
                    stream.transport.abort()
            self._tasks.discard(task)

    async def close(self) -> None:
        """Stop listening and cut every connection; idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _LinkOver(Exception):
    """Ends a link's task group once its server side is done."""
