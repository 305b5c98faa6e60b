"""A UDP socket per session within ``ice.port_min..port_max`` (``ice.udp_mux = false``).

:class:`SessionSockets` is the :class:`whip.rtc.ice_sockets.IceSocketProvider` that
restores aioice's one-socket-per-host-address behaviour, with two changes.

Rules:

- **The port range.** Each socket binds a port of ``port_min..port_max`` (``0/0``: any
  port, as aioice). Ports are tried from a random point of the range onward, skipping the
  ones this provider already holds, each with one non-blocking ``bind``; when none is
  free the session is refused with :class:`UdpPortsExhaustedError` (503, code
  ``udp_ports_exhausted``, ``Retry-After``), counted
  (:attr:`whip.rtc.session_protocol.IceSocketCounters.ports_exhausted`), and the sockets
  it already opened are closed.
- **The hole closed.** Every socket's datagrams pass a routing table of its own
  (:class:`whip.rtc.udp_mux_routes.UdpMuxRoutes`, one session, counters shared by all
  the provider's tables) before aioice sees them: media from an address no Binding
  request verified is dropped and counted, as on the shared port.
- **Close.** ``Connection.close`` closes the sockets (aioice's path); the port returns to
  the range when the socket is lost. :attr:`SessionSockets.registered_sessions` counts
  connections with an open socket.
- Event loop thread only; counters readable from any thread.

aioice internals touched: ``Connection._protocols`` (the protocols are added as aioice's
own code does); the candidate helpers ``candidate_foundation`` / ``candidate_priority``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import socket

from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import Connection

from whip.errors import HttpError
from whip.rtc.ice_sockets import IceCredentialsInUseError
from whip.rtc.session_protocol import IceSocketCounters, SessionStunProtocol
from whip.rtc.udp_mux import family_of
from whip.rtc.udp_mux_routes import UdpMuxCounters, UdpMuxRoutes, UfragInUse

logger = logging.getLogger(__name__)


def _same(protocol: SessionStunProtocol) -> SessionStunProtocol:
    return protocol


class UdpPortsExhaustedError(HttpError):
    """No port of ``ice.port_min..port_max`` is free for a new session's socket."""

    http_status = 503
    code = "udp_ports_exhausted"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "5"})


class SessionSockets:
    """Per-session sockets within a port range (module rules)."""

    def __init__(
        self,
        port_min: int = 0,
        port_max: int = 0,
        *,
        route_counters: UdpMuxCounters | None = None,
        counters: IceSocketCounters | None = None,
    ) -> None:
        if (port_min, port_max) != (0, 0) and not 1 <= port_min <= port_max <= 65535:
            raise ValueError(f"bad UDP port range {port_min}..{port_max}")
        self.port_min = port_min
        self.port_max = port_max
        self.route_counters = route_counters if route_counters is not None else UdpMuxCounters()
        self.counters = counters if counters is not None else IceSocketCounters()
        self._held: dict[SessionStunProtocol, int] = {}
        self._ports_in_use: set[tuple[socket.AddressFamily, int]] = set()

    @property
    def registered_sessions(self) -> int:
        """Connections with at least one open socket."""
        return len({protocol.connection for protocol in self._held})

    @property
    def addresses_learned(self) -> int:
        """Remote addresses verified on the provider's sockets, all sessions."""
        return sum(
            protocol.routes.learned_addresses
            for protocol in self._held
            if protocol.routes is not None
        )

    @property
    def sockets_open(self) -> int:
        """Sockets this provider holds."""
        return len(self._held)

    async def component_candidates(
        self, connection: Connection, component: int, addresses: list[str]
    ) -> list[Candidate]:
        """One socket per address within the range (module rules)."""
        opened: list[SessionStunProtocol] = []
        try:
            for address in addresses:
                routes: UdpMuxRoutes[SessionStunProtocol] = UdpMuxRoutes(
                    counters=self.route_counters
                )
                protocol = SessionStunProtocol(
                    connection, self.counters, routes=routes, on_lost=self._lost
                )
                port = await self._bind(protocol, address)
                self._held[protocol] = port
                self._ports_in_use.add((family_of(address), port))
                opened.append(protocol)
                protocol.local_candidate = Candidate(
                    foundation=candidate_foundation("host", "udp", address),
                    component=component,
                    transport="udp",
                    priority=candidate_priority(component, "host"),
                    host=address,
                    port=port,
                    type="host",
                )
                try:
                    routes.register(protocol, connection.local_username, connection.local_password)
                except UfragInUse as exc:  # one session per table: cannot happen
                    raise IceCredentialsInUseError(str(exc)) from exc
        except BaseException:
            for protocol in opened:
                protocol.transport.close()
            raise
        connection._protocols += opened
        return [protocol.local_candidate for protocol in opened]

    def publisher_closing(self, connection: Connection) -> int:
        """Nothing to send: the session's own sockets close with it, and the kernel answers
        the publisher's next datagram to a closed port with the ICMP port unreachable."""
        return 0

    def refresh_credentials(self, connection: Connection) -> None:
        """Register ``connection``'s current credentials again in each of its sockets'
        tables (ICE restart; see :func:`whip.rtc.ice_sockets.refresh_ice_credentials`)."""
        for protocol in self._held:
            if protocol.connection is connection and protocol.routes is not None:
                protocol.routes.register(
                    protocol, connection.local_username, connection.local_password
                )

    async def _bind(self, protocol: SessionStunProtocol, address: str) -> int:
        """Open ``protocol``'s socket on ``address`` and a port of the range (the loop
        creates and owns the socket, as aioice's own code lets it: closing the transport
        closes the socket at once, so a publisher still sending gets ICMP port
        unreachable); the port, or :class:`UdpPortsExhaustedError`.

        Cancellation: nothing stays open."""
        loop = asyncio.get_running_loop()
        family = family_of(address)
        if (self.port_min, self.port_max) == (0, 0):
            candidates = [0]
        else:
            span = self.port_max - self.port_min + 1
            start = random.randrange(span)
            candidates = [
                port
                for step in range(span)
                if (family, port := self.port_min + (start + step) % span) not in self._ports_in_use
            ]
        for port in candidates:
            try:
                transport, _ = await loop.create_datagram_endpoint(
                    functools.partial(_same, protocol), local_addr=(address, port)
                )
            except OSError:
                if port == 0:
                    raise
                continue
            bound: int = transport.get_extra_info("sockname")[1]
            return bound
        self.counters.ports_exhausted += 1
        logger.warning(
            "ice: no free UDP port in %d..%d on %s: session refused",
            self.port_min,
            self.port_max,
            address,
        )
        raise UdpPortsExhaustedError(
            f"no free UDP port in ice.port_min..port_max ({self.port_min}..{self.port_max})"
        )

    def _lost(self, protocol: SessionStunProtocol) -> None:
        port = self._held.pop(protocol, None)
        if port is not None:
            self._ports_in_use.discard((family_of(protocol.local_candidate.host), port))
            if protocol.routes is not None:
                protocol.routes.unregister(protocol)


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    if "self._protocols" in inspect.getsource(Connection.close):
        return []
    return ["aioice.ice.Connection._protocols (closed by close)"]
