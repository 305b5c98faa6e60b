"""The shared UDP port: one socket per address family for every session's ICE, DTLS, SRTP.

:class:`UdpMux` is the :class:`whip.rtc.ice_sockets.IceSocketProvider` of ``ice.udp_mux =
true``. It owns the sockets and the :class:`whip.rtc.udp_mux_routes.UdpMuxRoutes` table;
each session gets a :class:`whip.rtc.session_protocol.SessionStunProtocol` per host
address whose transport is a :class:`SharedTransportView` of its family's socket.

Rules:

- **Families.** :meth:`UdpMux.start` opens one socket per address family among the host
  addresses ICE gathers on (:func:`aioice.ice.get_host_addresses`, as
  :func:`whip.cli.configure_ice` restricted it): IPv4 and IPv6 are separate sockets
  (IPv6 with ``IPV6_V6ONLY``), on one port number when ``ice.udp_port`` is fixed; with
  ``0`` the IPv4 socket takes a free port and the IPv6 one tries the same number first,
  then any. A family with one address binds that address; with several it binds the
  wildcard (``0.0.0.0`` / ``::``) and the kernel picks the source address of replies.
  An address of a family with no socket (an interface that appeared after start) gets
  no candidate, logged. A bind failure (port in use) is :class:`UdpPortInUseError`: the
  server does not start.
- **Routing.** The socket's ``datagram_received`` asks the table; a routed datagram goes
  to the session's protocol of that family (its first address's), a dropped one is only
  counted by the table. Nothing else is done per datagram. So the answer to a check the
  server sends toward a candidate of the offer is routed only once that address has sent
  a verified check of its own: full-ICE publishers (browsers, OBS, FFmpeg, aiortc) always
  do, and aioice's triggered check then succeeds; an ICE-lite publisher, which never
  checks, cannot connect through the mux (``ice.udp_mux = false`` has the same rule).
- **Sessions.** :meth:`UdpMux.component_candidates` (component 1 only: aiortc muxes RTCP)
  registers the connection's credentials under a :class:`MuxSession` (the table's handle)
  and answers one host candidate per address with the family's port. A collision is
  :class:`whip.rtc.ice_sockets.IceCredentialsInUseError` and nothing stays registered.
  Closing the last of a session's views unregisters it (its addresses go too); a view's
  close never closes the shared socket.
- **A close the server decides.** :meth:`UdpMux.publisher_closing` (before the peer
  connection closes) sends the ICMP port unreachable a closed per-session socket would
  have drawn, to the addresses learned for the session (:mod:`whip.rtc.port_unreachable`).
- **Lifecycle.** :meth:`UdpMux.aclose` (app cleanup, after every session closed) closes
  the sockets; a view that sends after that sends nothing.
- Event loop thread only; :attr:`UdpMux.routes` counters and :attr:`UdpMux.counters`
  are readable from any thread.

aioice internals touched: ``Connection._protocols`` (the session's protocols are added,
as aioice's own code does, so pairing, ``close`` and consent find them),
``Connection.local_username`` / ``local_password`` (public), ``aioice.ice.get_host_addresses``
and the candidate helpers ``candidate_foundation`` / ``candidate_priority``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import ipaddress
import logging
import socket
from typing import Any

import aioice.candidate
import aioice.ice
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import Connection

from whip.rtc.ice_sockets import IceCredentialsInUseError
from whip.rtc.port_unreachable import PortUnreachable
from whip.rtc.session_protocol import IceSocketCounters, SessionStunProtocol
from whip.rtc.udp_mux_routes import UdpMuxRoutes, UfragInUse

logger = logging.getLogger(__name__)

Family = socket.AddressFamily
"""``socket.AF_INET`` or ``socket.AF_INET6``."""

RECEIVE_BUFFER_BYTES = 4 << 20
"""The shared socket's SO_RCVBUF request: every session's media queues in one buffer."""


class UdpPortInUseError(OSError):
    """The mux port could not be bound (a local fault: the server does not start)."""


def family_of(address: str) -> Family:
    """The address family of an IP address."""
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET


class MuxSession:
    """One registered connection: the table's handle, and its protocols by family."""

    __slots__ = ("__weakref__", "connection", "protocols", "receivers")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.protocols: list[SessionStunProtocol] = []
        self.receivers: dict[Family, SessionStunProtocol] = {}

    def __repr__(self) -> str:
        return f"MuxSession({self.connection.local_username})"


class SharedTransportView(asyncio.DatagramTransport):
    """One session protocol's transport: sends through the shared socket; closing it
    unregisters the protocol and never closes the socket (module rules)."""

    def __init__(self, mux: UdpMux, family: Family, sockname: tuple[Any, ...]) -> None:
        super().__init__()
        self._mux = mux
        self._family = family
        self._sockname = sockname
        self._protocol: SessionStunProtocol | None = None
        self._closing = False

    def attach(self, protocol: SessionStunProtocol) -> None:
        """Bind the view to its protocol (``connection_made``)."""
        self._protocol = protocol
        protocol.connection_made(self)

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing:
            return
        shared = self._mux.transport_of(self._family)
        if shared is not None and not shared.is_closing():
            shared.sendto(data, addr)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self._sockname
        return default  # never the shared socket itself: nobody may close or tune it

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        protocol = self._protocol
        if protocol is not None:
            self._mux.protocol_closed(protocol)
            asyncio.get_running_loop().call_soon(protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()


class _SharedSocketProtocol(asyncio.DatagramProtocol):
    """The shared socket's protocol: route, then deliver (module rules)."""

    def __init__(self, mux: UdpMux, family: Family) -> None:
        self._mux = mux
        self._family = family

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        source = (addr[0], addr[1])
        session, _reason = self._mux.routes.route(data, source)
        if session is not None:
            receiver = session.receivers.get(self._family)
            if receiver is not None:
                receiver.deliver(data, source)

    def error_received(self, exc: Exception) -> None:
        # An ICMP error for one remote (port unreachable) says nothing about the others.
        logger.debug("udp mux: socket error %r", exc)


class UdpMux:
    """The shared port (module rules)."""

    def __init__(
        self,
        port: int,
        *,
        routes: UdpMuxRoutes[MuxSession] | None = None,
        counters: IceSocketCounters | None = None,
    ) -> None:
        self.requested_port = port
        self.routes: UdpMuxRoutes[MuxSession] = routes if routes is not None else UdpMuxRoutes()
        self.counters = counters if counters is not None else IceSocketCounters()
        self._transports: dict[Family, asyncio.DatagramTransport] = {}
        self._socknames: dict[Family, tuple[Any, ...]] = {}
        self._sessions: dict[Connection, MuxSession] = {}
        self.unreachable = PortUnreachable()

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, host_addresses: list[str] | None = None) -> None:
        """Open one socket per family of ``host_addresses`` (default: what aioice gathers
        on). Raises :class:`UdpPortInUseError` (nothing stays open) when a bind fails.

        Cancellation: the sockets opened so far are closed."""
        addresses = (
            aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True)
            if host_addresses is None
            else host_addresses
        )
        by_family: dict[Family, list[str]] = {}
        for address in addresses:
            by_family.setdefault(family_of(address), []).append(address)
        if not by_family:
            raise UdpPortInUseError(errno.EADDRNOTAVAIL, "no host address to bind the UDP mux")
        loop = asyncio.get_running_loop()
        try:
            port = self.requested_port
            for family in (socket.AF_INET, socket.AF_INET6):
                if family not in by_family:
                    continue
                members = by_family[family]
                host = members[0] if len(members) == 1 else _wildcard(family)
                sock = _bind(family, host, port, retry_any=self.requested_port == 0)
                transport, _ = await loop.create_datagram_endpoint(
                    functools.partial(_SharedSocketProtocol, self, family), sock=sock
                )
                self._transports[family] = transport
                self._socknames[family] = sock.getsockname()
                port = self._socknames[family][1]
        except BaseException:
            await self.aclose()
            raise
        for family, name in self._socknames.items():
            logger.info("udp mux: listening on %s port %d (%s)", name[0], name[1], family.name)

    async def aclose(self) -> None:
        """Close the shared sockets (idempotent). Sessions still registered keep their
        entries until they close; their sends go nowhere."""
        transports, self._transports = self._transports, {}
        for transport in transports.values():
            transport.close()
        self.unreachable.close()
        if transports:
            logger.info("udp mux: closed (%d sessions still registered)", len(self.routes))

    @property
    def ports(self) -> list[tuple[str, int]]:
        """``(bound address, port)`` of each open socket, IPv4 first."""
        return [(name[0], name[1]) for name in self._socknames.values() if name]

    def transport_of(self, family: Family) -> asyncio.DatagramTransport | None:
        """The shared socket of ``family``, if open."""
        return self._transports.get(family)

    # -- sessions ---------------------------------------------------------------------

    async def component_candidates(
        self, connection: Connection, component: int, addresses: list[str]
    ) -> list[Candidate]:
        """Register ``connection`` and answer its host candidates (module rules)."""
        if component != 1:
            logger.warning("udp mux: component %d has no candidate (rtcp-mux only)", component)
            return []
        session = MuxSession(connection)
        candidates: list[Candidate] = []
        for address in addresses:
            family = family_of(address)
            sockname = self._socknames.get(family)
            if sockname is None or family not in self._transports:
                logger.warning("udp mux: no socket for %s: no candidate on it", address)
                continue
            view = SharedTransportView(self, family, (address, sockname[1]))
            protocol = SessionStunProtocol(connection, self.counters)
            view.attach(protocol)
            protocol.local_candidate = Candidate(
                foundation=candidate_foundation("host", "udp", address),
                component=component,
                transport="udp",
                priority=candidate_priority(component, "host"),
                host=address,
                port=sockname[1],
                type="host",
            )
            session.protocols.append(protocol)
            session.receivers.setdefault(family, protocol)
            candidates.append(protocol.local_candidate)
        if not session.protocols:
            return []
        try:
            self.routes.register(session, connection.local_username, connection.local_password)
        except UfragInUse as exc:
            for protocol in session.protocols:
                protocol.transport.close()
            raise IceCredentialsInUseError(str(exc)) from exc
        self._sessions[connection] = session
        connection._protocols += session.protocols
        return candidates

    def refresh_credentials(self, connection: Connection) -> None:
        """Register ``connection``'s current credentials again (ICE restart; see
        :func:`whip.rtc.ice_sockets.refresh_ice_credentials`)."""
        session = self._sessions.get(connection)
        if session is None:
            return
        try:
            self.routes.register(session, connection.local_username, connection.local_password)
        except UfragInUse as exc:
            raise IceCredentialsInUseError(str(exc)) from exc

    def publisher_closing(self, connection: Connection) -> int:
        """The server is about to close ``connection``'s session: tell each address
        learned for it that the port is gone (module rules); the ICMP messages sent."""
        session = self._sessions.get(connection)
        if session is None:
            return 0
        publishers = self.routes.addresses_of(session)
        servers = [
            (protocol.local_candidate.host, protocol.local_candidate.port)
            for protocol in session.protocols
        ]
        return self.unreachable.send(publishers, servers)

    def protocol_closed(self, protocol: SessionStunProtocol) -> None:
        """A view closed: forget its protocol; the session's last one unregisters it."""
        session = self._sessions.get(protocol.connection)
        if session is None or protocol not in session.protocols:
            return
        session.protocols.remove(protocol)
        session.receivers = {}
        for remaining in session.protocols:
            session.receivers.setdefault(family_of(remaining.local_candidate.host), remaining)
        if not session.protocols:
            del self._sessions[protocol.connection]
            self.routes.unregister(session)

    @property
    def registered_sessions(self) -> int:
        """Connections registered on the port."""
        return len(self.routes)


def _wildcard(family: Family) -> str:
    return "::" if family == socket.AF_INET6 else "0.0.0.0"


def _bind(family: Family, host: str, port: int, *, retry_any: bool) -> socket.socket:
    """A bound, non-blocking UDP socket; ``retry_any``: a taken ``port`` falls back to a
    free one (``ice.udp_port = 0``)."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        except OSError:
            logger.debug("udp mux: SO_RCVBUF refused", exc_info=True)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if not (retry_any and port != 0):
                raise UdpPortInUseError(
                    exc.errno, f"cannot bind the ICE UDP port {host} {port}: {exc.strerror}"
                ) from exc
            sock.bind((host, 0))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    if "self._protocols" not in inspect.getsource(Connection.close):
        problems.append("aioice.ice.Connection._protocols (closed by close)")
    for name in ("candidate_foundation", "candidate_priority"):
        if not callable(getattr(aioice.candidate, name, None)):
            problems.append(f"aioice.candidate.{name}")
    return problems
