"""A webhook's own HTTP/1.1 client: POSTs over keep-alive connections to its receiver.

Why: a delivery's HTTP attempt was aiohttp's client, about 230 µs of CPU per request
(its request object, connector, tracing hooks, response parser and stream reader); py-spy
put ``ClientSession._request`` at 43 % of the delivery child's samples under sustained
load, and on a two-core host that CPU is taken from the server's appends
(docs/PERFORMANCE.md, "Sustained delivery load"). A webhook needs one thing of HTTP: a
POST of a small body and the status of the answer. This client does that and nothing
else, on an :class:`asyncio.Protocol`.

Rules:

- **Connections**: at most ``parallel`` open at once (:class:`HttpClient`), each carrying
  one request at a time (no pipelining); more requests wait their turn in order. A
  connection is kept for the next request (keep-alive) only when its answer was HTTP/1.1
  without ``Connection: close``, its body was framed by a length or chunks and read
  whole, and nothing came after it; otherwise it is closed. An idle connection the
  receiver closed is dropped; one idle for :data:`IDLE_S` or more is closed instead of
  reused.
- **A reused connection that fails before any byte of its answer** (the receiver closed
  it while the request was written: a race of every keep-alive client) is retried once,
  at once, on a new connection. The receiver may then see the request twice, with the
  same ``webhook-id``: at least once allows it.
- **Answers**: the status line and headers (together at most :data:`MAX_HEAD_BYTES`;
  more is a :class:`ProtocolError`), informational 1xx answers skipped, then at most
  ``max_body`` bytes of the body, framed by ``Content-Length``, chunked transfer coding,
  or the connection's end. A longer body is not drained: the connection is closed.
  Bodies are not decompressed (no ``Accept-Encoding`` is sent).
- **Requests**: ``POST`` with ``Host``, ``User-Agent``, ``Content-Length`` and the
  caller's headers; a header name or value with CR, LF or NUL (or a name with a colon)
  is a ``ValueError`` before anything is sent. No proxies, no cookies, no redirects
  followed (a 3xx is an answer like any other). ``https`` URLs use the default TLS
  context (certificates and host name verified) or the one given.
- **Errors**: what the network does is an :class:`OSError` (the end of the connection
  before a complete answer: :class:`ConnectionError`; TLS: :class:`ssl.SSLError`); what
  the receiver sends that is not HTTP/1.x is a :class:`ProtocolError` (a ``ValueError``).
- **Cancellation** (a timeout around :meth:`HttpClient.post` included): the request's
  connection is aborted, never reused. :meth:`HttpClient.close` closes the idle ones.
- Loop-only: an :class:`HttpClient` is used on one event loop.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES: Final = 64 * 1024
"""Bound on an answer's status line and headers together."""
IDLE_S: Final = 15.0
"""An idle connection this old is closed rather than reused."""
USER_AGENT: Final = "whip-ingest-webhooks/1"

_BODYLESS_STATUSES: Final = frozenset({204, 304})


class ProtocolError(ValueError):
    """The receiver's answer is not HTTP/1.x as this client reads it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer's status and the first bytes of its body (at most ``max_body``)."""

    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a URL's requests go and what its request line and Host header say."""

    secure: bool
    host: str
    port: int
    host_header: str
    target: str

    @property
    def pool(self) -> tuple[bool, str, int]:
        """What a kept connection can be reused for: the scheme, host and port."""
        return self.secure, self.host, self.port


def _origin(url: str) -> _Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")
    secure = parts.scheme == "https"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    port = parts.port or (443 if secure else 80)
    host_header = parts.netloc.rpartition("@")[2]
    return _Origin(secure, parts.hostname, port, host_header, target)


def _unsafe(text: str) -> bool:
    return "\r" in text or "\n" in text or "\0" in text


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: bytes in a buffer, read by the request that owns it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.at_eof = False
        self.lost = False
        self.error: Exception | None = None
        self.idle_since = 0.0
        self.received = 0
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.received += len(data)
        self._wake()

    def eof_received(self) -> bool:
        self.at_eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.at_eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.lost = True

    async def more(self) -> None:
        """Wait for more bytes; ConnectionError at the connection's end."""
        if self.at_eof:
            detail = f": {self.error}" if self.error is not None else ""
            raise ConnectionError(
                f"the receiver closed the connection before a complete answer{detail}"
            )
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def until(self, separator: bytes, limit: int, what: str) -> bytes:
        """The bytes before ``separator`` (both taken from the buffer); a ProtocolError
        naming ``what`` when more than ``limit`` bytes come without it."""
        start = 0
        while True:
            end = self.buffer.find(separator, start)
            if end >= 0:
                found = bytes(self.buffer[:end])
                del self.buffer[: end + len(separator)]
                return found
            if len(self.buffer) > limit:
                raise ProtocolError(f"{what} of the answer is over {limit} bytes")
            start = max(0, len(self.buffer) - len(separator) + 1)
            await self.more()

    async def line(self, limit: int) -> bytes:
        """One CRLF-ended line (without it), at most ``limit`` bytes."""
        return await self.until(b"\r\n", limit, "a line")

    async def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self.more()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


@dataclass(slots=True)
class _Head:
    status: int
    keep_alive: bool
    length: int | None
    chunked: bool


async def _read_head(conn: _Connection) -> _Head:
    """The status line and headers of the final (non-1xx) answer."""
    while True:
        head = await conn.until(b"\r\n\r\n", MAX_HEAD_BYTES, "the status line and headers")
        parsed = _parse_head(head)
        if 100 <= parsed.status < 200 and parsed.status != 101:
            continue
        return parsed


def _parse_head(head: bytes) -> _Head:
    lines = head.split(b"\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    status = int(code)
    keep_alive = version == b"HTTP/1.1"
    length: int | None = None
    codings: list[bytes] = []
    for raw in lines[1:]:
        name, colon, value = raw.partition(b":")
        if not colon or not name or name != name.strip():
            raise ProtocolError(f"not a header line: {raw[:80]!r}")
        key = name.lower()
        value = value.strip()
        if key == b"content-length":
            if not value.isdigit():
                raise ProtocolError(f"Content-Length is not a number: {value[:40]!r}")
            number = int(value)
            if length is not None and length != number:
                raise ProtocolError("two different Content-Length headers")
            length = number
        elif key == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",") if c.strip()]
        elif key == b"connection" and b"close" in [t.strip().lower() for t in value.split(b",")]:
            keep_alive = False
    if status in _BODYLESS_STATUSES or 100 <= status < 200:
        return _Head(status, keep_alive, 0, False)
    if codings:
        return _Head(status, keep_alive, None, codings[-1] == b"chunked")
    return _Head(status, keep_alive, length, False)


async def _read_body(conn: _Connection, head: _Head, max_body: int) -> tuple[bytes, bool]:
    """Up to ``max_body`` bytes of the body, and whether the body was read to its end."""
    if head.chunked:
        return await _read_chunked(conn, max_body)
    if head.length is not None:
        wanted = min(head.length, max_body)
        return await conn.exactly(wanted), wanted == head.length
    while len(conn.buffer) <= max_body and not conn.at_eof:
        await conn.more()
    whole = conn.at_eof and len(conn.buffer) <= max_body
    data = bytes(conn.buffer[:max_body])
    del conn.buffer[:max_body]
    return data, whole


async def _read_chunked(conn: _Connection, max_body: int) -> tuple[bytes, bool]:
    parts: list[bytes] = []
    size = 0
    while True:
        size_line = (await conn.line(1024)).partition(b";")[0].strip()
        try:
            chunk = int(size_line, 16)
        except ValueError:
            raise ProtocolError(f"not a chunk size: {size_line[:40]!r}") from None
        if chunk < 0:
            raise ProtocolError("a negative chunk size")
        if chunk == 0:
            while await conn.line(MAX_HEAD_BYTES):  # trailer fields, up to the empty line
                pass
            return b"".join(parts), True
        if size + chunk > max_body:
            parts.append(await conn.exactly(max_body - size))
            return b"".join(parts), False
        parts.append(await conn.exactly(chunk))
        size += chunk
        if await conn.exactly(2) != b"\r\n":
            raise ProtocolError("a chunk not followed by CRLF")


class HttpClient:
    """A webhook's HTTP/1.1 client (module rules)."""

    def __init__(self, parallel: int, tls: ssl.SSLContext | None = None) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self._slots = asyncio.Semaphore(parallel)
        self._idle: dict[tuple[bool, str, int], deque[_Connection]] = {}
        self._origins: dict[str, _Origin] = {}
        self._tls = tls
        self._closed = False

    async def post(self, url: str, body: bytes, headers: dict[str, str], max_body: int) -> Answer:
        """POST ``body`` to ``url`` once (a reused connection's early failure: twice; module
        rules) and return the answer. Raises OSError or ValueError (module rules)."""
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = _origin(url)
        request = self._request(origin, body, headers)
        async with self._slots:
            conn = self._idle_connection(origin)
            if conn is not None:
                try:
                    return await self._exchange(conn, origin, request, max_body, reused=True)
                except _StaleConnection:
                    pass
            conn = await self._connect(origin)
            return await self._exchange(conn, origin, request, max_body, reused=False)

    @staticmethod
    def _request(origin: _Origin, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [
            f"POST {origin.target} HTTP/1.1",
            f"Host: {origin.host_header}",
            f"User-Agent: {USER_AGENT}",
            f"Content-Length: {len(body)}",
        ]
        for name, value in headers.items():
            if _unsafe(name) or _unsafe(value) or ":" in name:
                raise ValueError(f"header {name!r} has a character a header cannot carry")
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1") + body

    def _idle_connection(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin.pool)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if conn.lost or conn.at_eof or conn.buffer or now - conn.idle_since >= IDLE_S:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.secure:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        _, conn = await loop.create_connection(
            _Connection,
            origin.host,
            origin.port,
            ssl=tls,
            server_hostname=origin.host if tls is not None else None,
        )
        return conn

    async def _exchange(
        self, conn: _Connection, origin: _Origin, request: bytes, max_body: int, *, reused: bool
    ) -> Answer:
        keep = False
        try:
            assert conn.transport is not None
            received = conn.received
            conn.transport.write(request)
            try:
                head = await _read_head(conn)
            except ConnectionError:
                if reused and conn.received == received:
                    raise _StaleConnection from None
                raise
            text, whole = await _read_body(conn, head, max_body)
            keep = head.keep_alive and whole and not conn.buffer
            return Answer(head.status, text)
        finally:
            if keep and not self._closed and not conn.lost:
                conn.idle_since = asyncio.get_running_loop().time()
                self._idle.setdefault(origin.pool, deque()).append(conn)
            else:
                conn.abort()

    async def close(self) -> None:
        """Close the idle connections; later posts raise (idempotent)."""
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()
        await asyncio.sleep(0)


class _StaleConnection(Exception):
    """A reused connection ended before any byte of its answer (retried on a new one)."""
