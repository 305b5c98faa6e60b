"""ICE-TCP: passive candidates on one listening TCP port for every session (RFC 6544,
RFC 4571 framing), served through aioice, which models TCP candidates but never serves them.

Rules:

- **One port.** :class:`IceTcpListener` listens on ``ice.tcp_port`` for every session
  (0: a free port, read back with :attr:`IceTcpListener.port`; -1: no listener at all).
  Each accepted connection carries RFC 4571 frames: a 2-byte big-endian length, then that
  many bytes, each frame one "datagram" (a STUN message, DTLS, SRTP or SRTCP).
- **Binding.** A connection starts unbound. Its first frame must be a Binding request
  that verifies for a registered session (:mod:`whip.rtc.ice_tcp_sessions`: the
  session's ufrag, its password's MESSAGE-INTEGRITY). Only then is the connection bound
  to that session, for its lifetime: a :class:`TcpStunProtocol` (aioice's
  ``StunProtocol`` with framed writes) joins the session's aioice ``Connection``, the
  peer becomes a ``tcp``/``active`` peer-reflexive remote candidate, and the frame, then
  every later one, is handed to the protocol as aioice's UDP protocol hands it
  datagrams. aioice answers, authenticates and checks from there on, as for UDP; its
  checks of a passive candidate are only the triggered checks of requests that arrived
  on a bound connection, sent back on it.
- **Refusals close the connection** at once (reset), counted by
  :class:`whip.rtc.ice_tcp_sessions.TcpRefusal`, never answered, never a crash: a first
  frame that does not verify; a frame longer than ``ice.tcp_max_frame_bytes`` (1500
  before binding); no verified request within ``ice.tcp_handshake_timeout_s``; more than
  ``ice.tcp_max_connections_per_address`` connections open from one remote IP, or
  ``ice.tcp_max_connections`` in total; a frame aioice fails on after binding
  (``stream_error``).
- **Lifetimes.** :func:`install_ice_tcp` is the hook on one peer connection: it registers
  the session at gathering (which also adds the passive candidates to the answer, after
  the UDP ones) and unregisters it at the start of every close of its aioice connection
  (``pc.close()``, consent or liveness expiry, a failed negotiation, shutdown), so no
  close path leaves credentials behind. aioice's ``Connection.close`` closes the bound
  TCP connections with its other protocols (an abort: a peer that stops reading cannot
  hold a close up). A bound connection that breaks ends only the pair it carried.
- **Writes** never block: a frame is dropped (counted, as UDP loses a datagram) when the
  connection's write buffer holds more than :data:`WRITE_BUFFER_LIMIT` bytes.
- **Threads.** Event loop thread only. :class:`IceTcpCounters` are plain ints readable
  from any thread (``/metrics``).

aioice internals touched (:func:`internals_problems`): ``aioice.ice.StunProtocol``
(subclassed; its ``_StunProtocol__closed`` future is resolved by ``connection_lost``),
``Connection._protocols``, ``Connection._remote_candidates``, ``Connection._closing``,
``Connection.get_component_candidates`` and ``Connection.close`` (shadowed per instance),
``check_incoming`` finding a remote candidate by ``_network_host`` and port; aiortc's
``RTCIceTransport._connection``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

import aioice.ice
import aioice.stun
from aioice.candidate import Candidate, candidate_foundation
from aioice.ice import Connection
from aiortc.rtcicetransport import RTCIceTransport

from whip.rtc.ice_tcp_sessions import (
    IceTcpSessions,
    PassiveTcpCandidate,
    TcpRefusal,
    UfragInUseError,
    passive_candidates,
)
from whip.rtc.peer import dtls_transports
from whip.rtc.stun import MAX_DATAGRAM

logger = logging.getLogger(__name__)

Address = tuple[str, int]

WRITE_BUFFER_LIMIT = 1 << 20
"""Bytes a connection may have waiting to be sent before frames are dropped."""
FRAME_HEADER = 2


@dataclass(slots=True)
class IceTcpCounters:
    """What the listener did (loop thread writes, any thread reads).

    ``accepted``: connections accepted by the socket; ``bound``: bound to a session;
    ``closed``: ended for any reason (by either side); ``frames_in``/``frames_out``:
    frames read on bound connections / written; ``frames_dropped``: written frames
    dropped on a full write buffer, and empty frames read; ``refused``: server closes by
    :class:`TcpRefusal`.
    """

    accepted: int = 0
    bound: int = 0
    closed: int = 0
    frames_in: int = 0
    frames_out: int = 0
    frames_dropped: int = 0
    refused: dict[TcpRefusal, int] = field(default_factory=lambda: dict.fromkeys(TcpRefusal, 0))

    def as_dict(self) -> dict[str, int]:
        """Every counter by name; refusals as ``refused_<reason>``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "refused"}
        out.update({f"refused_{r.value}": n for r, n in self.refused.items()})
        return out


@dataclass(frozen=True, slots=True)
class IceTcpLimits:
    """The bounds of module rule "Refusals" (``[ice]`` keys of the same names)."""

    handshake_timeout_s: float = 5.0
    max_connections: int = 1024
    max_connections_per_address: int = 16
    max_frame_bytes: int = 1500


class IceTcpBindError(RuntimeError):
    """The ICE-TCP port cannot be listened on (a local fault: the server must not start)."""


class TcpStunProtocol(aioice.ice.StunProtocol):
    """aioice's STUN protocol over one bound TCP connection: what aioice sends to any
    address goes to the connection's one peer, framed."""

    def __init__(
        self, receiver: Connection, stream: _IceTcpStream, local_candidate: Candidate
    ) -> None:
        super().__init__(receiver)
        self.local_candidate = local_candidate
        self.transport = cast(asyncio.DatagramTransport, stream.transport)  # close() only
        self._stream = stream

    def send_stun(self, message: aioice.stun.Message, addr: Address) -> None:
        self._stream.write_frame(bytes(message))

    async def send_data(self, data: bytes, addr: Address) -> None:
        self._stream.write_frame(data)

    async def close(self) -> None:
        """Abort the connection (a close would wait for a peer that stops reading to
        take the write buffer) and wait until it is lost."""
        self._stream.abort()
        closed: asyncio.Future[bool] = vars(self)["_StunProtocol__closed"]
        await closed

    def __repr__(self) -> str:
        return f"tcp-protocol({self.id} {self._stream.peer[0]}:{self._stream.peer[1]})"


class _IceTcpStream(asyncio.Protocol):
    """One accepted TCP connection: framing, the handshake, then its bound protocol."""

    def __init__(self, listener: IceTcpListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.peer: Address = ("", 0)
        self.local: Address = ("", 0)
        self._buffer = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._bound: TcpStunProtocol | None = None
        self._closed = False

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        self.peer, self.local = (peer[0], peer[1]), (local[0], local[1])
        refusal = self.listener.admit(self)
        if refusal is not None:
            self.refuse(refusal)
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(
            self.listener.limits.handshake_timeout_s, self.refuse, TcpRefusal.HANDSHAKE_TIMEOUT
        )

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        buffer = self._buffer
        buffer += data
        while len(buffer) >= FRAME_HEADER and not self._closed:
            length = (buffer[0] << 8) | buffer[1]
            limit = self.listener.limits.max_frame_bytes if self._bound else MAX_DATAGRAM
            if length > limit:
                self.refuse(TcpRefusal.OVERSIZE_FRAME)
                return
            end = FRAME_HEADER + length
            if len(buffer) < end:
                return
            frame = bytes(buffer[FRAME_HEADER:end])
            del buffer[:end]
            self._frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.listener.release(self)
        bound, self._bound = self._bound, None
        if bound is not None:
            bound.connection_lost(exc)
            connection = bound.receiver
            # Not while aioice's close() walks its protocols (it clears them itself).
            if not connection._closing and bound in connection._protocols:
                connection._protocols.remove(bound)

    # -- frames -------------------------------------------------------------------

    def _frame(self, frame: bytes) -> None:
        bound = self._bound
        if bound is None:
            self._handshake(frame)
            return
        if not frame:
            self.listener.counters.frames_dropped += 1
            return
        self.listener.counters.frames_in += 1
        try:
            bound.datagram_received(frame, self.peer)
        except Exception as exc:
            logger.warning("ice-tcp %s:%d: frame refused by aioice: %r", *self.peer, exc)
            self.refuse(TcpRefusal.STREAM_ERROR)

    def _handshake(self, frame: bytes) -> None:
        verified = self.listener.sessions.verify(frame)
        if isinstance(verified, TcpRefusal):
            self.refuse(verified)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.listener.counters.frames_in += 1
        try:
            self._bound = self.listener.bind(self, verified, frame)
            self._bound.datagram_received(frame, self.peer)
        except Exception as exc:
            logger.warning("ice-tcp %s:%d: first frame refused by aioice: %r", *self.peer, exc)
            self.refuse(TcpRefusal.STREAM_ERROR)

    def write_frame(self, data: bytes) -> None:
        """Send one frame, or drop it (module rule "Writes")."""
        transport = self.transport
        if transport is None or self._closed or transport.is_closing():
            self.listener.counters.frames_dropped += 1
            return
        if len(data) > 0xFFFF or transport.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
            self.listener.counters.frames_dropped += 1
            return
        transport.write(len(data).to_bytes(FRAME_HEADER, "big") + data)
        self.listener.counters.frames_out += 1

    def abort(self) -> None:
        """Close the connection at once (aioice closes its protocols with this)."""
        if self.transport is not None:
            self.transport.abort()

    def refuse(self, reason: TcpRefusal) -> None:
        """Close the connection for ``reason``, counted once."""
        if self._closed:
            return
        self._closed = True
        self.listener.counters.refused[reason] += 1
        # Debug only: refusals are counted by reason, and a flood must not flood the log.
        logger.debug("ice-tcp %s:%d: closed (%s)", *self.peer, reason.value)
        if self._timer is not None:
            self._timer.cancel()
        if self.transport is not None:
            self.transport.abort()


class IceTcpListener:
    """The one ICE-TCP port (module rules). Loop thread only; ``counters`` any thread."""

    def __init__(
        self,
        limits: IceTcpLimits,
        *,
        public_hosts: Sequence[str] = (),
        host_addresses: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.limits = limits
        self.public_hosts = tuple(public_hosts)
        self._host_addresses = host_addresses or _gathered_host_addresses
        self.counters = IceTcpCounters()
        self._server: asyncio.Server | None = None
        self._port = 0
        self.sessions = IceTcpSessions()
        self._open: set[_IceTcpStream] = set()
        self._per_address: dict[str, int] = {}

    # -- lifecycle ----------------------------------------------------------------

    async def start(self, host: str | None, port: int) -> None:
        """Listen on ``host`` (``None``: every interface) and ``port`` (0: a free one).

        Raises :class:`IceTcpBindError` when the port cannot be bound. Cancellation:
        nothing is left listening.
        """
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _IceTcpStream(self), host=host, port=port, reuse_address=True, backlog=1024
            )
        except OSError as exc:
            raise IceTcpBindError(f"ice.tcp_port {port}: cannot listen: {exc}") from exc
        self._port = self._server.sockets[0].getsockname()[1]
        logger.info("ice-tcp: listening on %s port %d", host or "every interface", self._port)

    @property
    def port(self) -> int:
        """The listening port (0 before :meth:`start`)."""
        return self._port

    @property
    def open_connections(self) -> int:
        """Connections open now, bound or not."""
        return len(self._open)

    @property
    def registered(self) -> int:
        """Sessions registered now."""
        return len(self.sessions)

    async def close(self) -> None:
        """Stop listening and close every connection (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for stream in list(self._open):
            if stream.transport is not None:
                stream.transport.abort()
        if server is not None:
            await server.wait_closed()

    # -- sessions -----------------------------------------------------------------

    def register(self, connection: Connection, label: str = "") -> None:
        """Register a session's aioice ``Connection`` (again after an ICE restart);
        :meth:`whip.rtc.ice_tcp_sessions.IceTcpSessions.register`."""
        self.sessions.register(connection, label)

    def unregister(self, connection: Connection) -> bool:
        """Forget ``connection``; whether it was registered (a second call is a no-op)."""
        return self.sessions.unregister(connection)

    def local_candidates(self, component: int) -> list[Candidate]:
        """The passive candidates of ``component``: the host addresses aioice gathers on,
        then each public host, on the listening port; none before :meth:`start`."""
        if not self._port:
            return []
        addresses = [*self._host_addresses(), *self.public_hosts]
        return passive_candidates(self._port, addresses, component)

    # -- connections (called by the streams) --------------------------------------

    def admit(self, stream: _IceTcpStream) -> TcpRefusal | None:
        """Count a new connection in, or say which cap refuses it."""
        self.counters.accepted += 1
        if len(self._open) >= self.limits.max_connections:
            return TcpRefusal.TOTAL_CAP
        host = stream.peer[0]
        if self._per_address.get(host, 0) >= self.limits.max_connections_per_address:
            return TcpRefusal.ADDRESS_CAP
        self._open.add(stream)
        self._per_address[host] = self._per_address.get(host, 0) + 1
        return None

    def release(self, stream: _IceTcpStream) -> None:
        """A connection ended (exactly once per admitted stream)."""
        self.counters.closed += 1
        if stream not in self._open:
            return
        self._open.discard(stream)
        host = stream.peer[0]
        left = self._per_address.get(host, 1) - 1
        if left:
            self._per_address[host] = left
        else:
            self._per_address.pop(host, None)

    def bind(self, stream: _IceTcpStream, connection: Connection, frame: bytes) -> TcpStunProtocol:
        """Bind ``stream`` to ``connection``: its protocol joins the connection's, and the
        peer is known as a TCP peer-reflexive remote candidate (aioice would learn it as
        UDP), so the triggered check pairs that candidate with this connection only."""
        message = aioice.stun.parse_message(frame)  # first: a raise leaves nothing behind
        local = self._local_candidate_for(stream.local)
        protocol = TcpStunProtocol(connection, stream, local)
        connection._protocols.append(protocol)
        peer_host, peer_port = stream.peer
        known = any(
            c._network_host == peer_host and c.port == peer_port
            for c in connection._remote_candidates
        )
        if not known:
            connection._remote_candidates.append(
                Candidate(
                    foundation=candidate_foundation("prflx", "tcp", peer_host),
                    component=local.component,
                    transport="tcp",
                    priority=message.attributes.get("PRIORITY", 0),
                    host=peer_host,
                    port=peer_port,
                    type="prflx",
                    tcptype="active",
                )
            )
        self.counters.bound += 1
        label = self.sessions.label_of(connection)
        logger.info("ice-tcp %s:%d: bound to session %s", peer_host, peer_port, label)
        return protocol

    def _local_candidate_for(self, local: Address) -> Candidate:
        """The advertised candidate the connection arrived on (by address), else the
        first one (a NAT's public address arrives on a local one)."""
        candidates = self.local_candidates(1)
        for candidate in candidates:
            if candidate.host == local[0]:
                return candidate
        if candidates:
            return candidates[0]
        return PassiveTcpCandidate(
            foundation=candidate_foundation("host", "tcp", local[0]),
            component=1,
            transport="tcp",
            priority=0,
            host=local[0],
            port=local[1],
            type="host",
            tcptype="passive",
        )


def _gathered_host_addresses() -> list[str]:
    """The addresses aioice gathers UDP host candidates on (looked up at call time:
    :func:`whip.rtc.host_addresses.restrict_host_addresses` replaces it)."""
    addresses: list[str] = aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True)
    return addresses


def install_ice_tcp(pc: Any, listener: IceTcpListener, label: str) -> None:
    """The hook (module rule "Registration") on every ICE connection of ``pc``. Call
    after ``setRemoteDescription`` (the transports exist), before
    ``setLocalDescription`` (which gathers). A ufrag already in use by another session
    leaves this one without TCP candidates (logged); it is still served over UDP."""
    for dtls in dtls_transports(pc):
        connection = dtls.transport._connection
        _hook_gathering(connection, listener, label)
        _hook_close(connection, listener)


def _hook_gathering(connection: Connection, listener: IceTcpListener, label: str) -> None:
    gather: Callable[..., Awaitable[list[Candidate]]] = connection.get_component_candidates

    async def get_component_candidates(
        component: int, addresses: list[str], **options: Any
    ) -> list[Candidate]:
        candidates = await gather(component=component, addresses=addresses, **options)
        if connection._closing:
            return candidates
        try:
            listener.register(connection, label)
        except UfragInUseError as exc:
            logger.warning("session %s: no ICE-TCP candidates: %s", label, exc)
            return candidates
        return [*candidates, *listener.local_candidates(component)]

    shadowed: Any = connection  # an instance attribute shadows the method
    shadowed.get_component_candidates = get_component_candidates


def _hook_close(connection: Connection, listener: IceTcpListener) -> None:
    close: Callable[[], Awaitable[None]] = connection.close

    async def close_and_unregister() -> None:
        listener.unregister(connection)
        await close()

    shadowed: Any = connection  # an instance attribute shadows the method
    shadowed.close = close_and_unregister


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    protocol = getattr(aioice.ice, "StunProtocol", None)
    if protocol is None:
        return ["aioice.ice.StunProtocol"]
    protocol_source = inspect.getsource(protocol)
    for needed, name in (
        ("self.__closed", "StunProtocol._StunProtocol__closed"),
        ("self.transactions", "StunProtocol.transactions"),
        ("def send_stun", "StunProtocol.send_stun"),
        ("async def send_data", "StunProtocol.send_data"),
        ("self.receiver.protocol_lost(self)", "StunProtocol.connection_lost"),
    ):
        if needed not in protocol_source:
            problems.append(f"aioice.ice.{name}")
    connection = aioice.ice.Connection
    init = inspect.getsource(connection.__init__)
    for name in ("_protocols", "_remote_candidates", "_closing"):
        if f"self.{name}" not in init:
            problems.append(f"aioice.ice.Connection.{name}")
    for needed, where in (
        ("self.get_component_candidates(", connection.gather_candidates),
        ("c._network_host == addr[0] and c.port == addr[1]", connection.check_incoming),
        ("self._closing = True", connection.close),
    ):
        if needed not in inspect.getsource(where):
            problems.append(f"aioice.ice.Connection.{where.__name__}: {needed}")
    if "_network_host" not in inspect.getsource(Candidate.__init__):
        problems.append("aioice.candidate.Candidate._network_host")
    if "self._connection" not in inspect.getsource(RTCIceTransport.__init__):
        problems.append("aiortc.rtcicetransport.RTCIceTransport._connection")
    return problems
