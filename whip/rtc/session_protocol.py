"""One session's STUN protocol: aioice's own, fed only verified datagrams, following a
publisher whose address changes (NAT rebinding).

:class:`SessionStunProtocol` is what a server-side aioice ``Connection`` uses as its
``StunProtocol`` in both socket modes: on the shared port (:mod:`whip.rtc.udp_mux`, which
routes and calls :meth:`SessionStunProtocol.deliver`) and on a socket of its own
(:mod:`whip.rtc.session_sockets`, whose datagrams pass this protocol's own
:class:`whip.rtc.udp_mux_routes.UdpMuxRoutes` first).

Rules:

- **Nothing unverified reaches aioice.** aioice's ``StunProtocol.datagram_received``
  hands every non-STUN datagram to the connection, from any address. Here a datagram
  reaches aioice only once its source address is learned by the routing table, that is
  after a Binding request from that address verified with the session's password; the
  rest is dropped and counted by the table (``dropped_<reason>``).
- **A broken datagram breaks nothing.** An exception aioice raises on one datagram (its
  STUN parser raises ``struct.error`` on some truncated attributes) is counted
  (:attr:`IceSocketCounters.delivery_errors`) and logged once per protocol; it never
  reaches the transport, which would close the socket (the shared one: every session's).
- **Following a rebinding.** aioice as the controlled agent moves its selected pair only
  on USE-CANDIDATE; a publisher whose NAT rebinds (or that moves to another local port)
  without an ICE restart keeps sending consent checks, without USE-CANDIDATE, from its
  new address. aioice answers them and checks the new pair back (a triggered check);
  this protocol moves the selected pair to the new address when media (any non-STUN
  datagram) arrives from it and that pair has succeeded: both directions verified with
  the session's credentials. The publisher decides which path carries its media; the
  server follows it, never ahead of a verified check. Each move is counted
  (:attr:`IceSocketCounters.selected_pair_moves`) and logged ``old -> new``.
- **Close.** ``close()`` (aioice's ``Connection.close``) closes the transport, which for
  the shared port is a view whose close only unregisters the session
  (:mod:`whip.rtc.udp_mux`); ``on_lost`` runs once, when the protocol is lost.
- Event loop thread only, like aioice.

aioice internals touched: ``StunProtocol`` (subclassed: ``datagram_received``,
``connection_lost``, ``receiver``, ``local_candidate``), ``Connection._nominated`` and
``Connection._check_list`` (read, and the move writes ``_nominated``), ``CandidatePair``
(``protocol``, ``remote_addr``, ``state``, ``nominated``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import aioice.ice
from aioice.ice import CandidatePair, Connection, StunProtocol

from whip.rtc.udp_mux_routes import Address, UdpMuxRoutes

logger = logging.getLogger(__name__)

_SUCCEEDED = CandidatePair.State.SUCCEEDED


@dataclass(slots=True)
class IceSocketCounters:
    """What the session protocols did beyond routing (loop thread writes, any thread
    reads). ``delivery_errors``: datagrams aioice raised on; ``selected_pair_moves``:
    selected pairs moved to a publisher's new address; ``ports_exhausted``: sessions
    refused because no port of ``ice.port_min..port_max`` was free (per-session sockets)."""

    delivery_errors: int = 0
    selected_pair_moves: int = 0
    ports_exhausted: int = 0

    def as_dict(self) -> dict[str, int]:
        """Every counter by its field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class SessionStunProtocol(StunProtocol):
    """aioice's ``StunProtocol`` for one server-side connection (module rules)."""

    def __init__(
        self,
        connection: Connection,
        counters: IceSocketCounters,
        *,
        routes: UdpMuxRoutes[Any] | None = None,
        on_lost: Callable[[SessionStunProtocol], None] | None = None,
    ) -> None:
        """``routes``: this protocol's own routing table (a socket of its own), ``None``
        when the shared port routes for it; ``on_lost``: called once when lost."""
        super().__init__(connection)
        self.connection = connection
        self.counters = counters
        self.routes = routes
        self._on_lost = on_lost
        self._lost = False
        self._reported_error = False

    def datagram_received(self, data: bytes | str, addr: tuple[Any, ...]) -> None:
        """A datagram on this protocol's own socket: routed by its table, then
        delivered (module rules). Never raises."""
        source = (addr[0], addr[1])
        datagram = data.encode() if isinstance(data, str) else data  # always bytes for UDP
        if self.routes is not None:
            handle, _reason = self.routes.route(datagram, source)
            if handle is None:
                return
        self.deliver(datagram, source)

    def deliver(self, data: bytes, addr: Address) -> None:
        """A datagram already routed to this session: to aioice, then follow the media's
        address (module rules). Never raises."""
        try:
            super().datagram_received(data, addr)
        except Exception:
            self.counters.delivery_errors += 1
            if not self._reported_error:
                self._reported_error = True
                logger.warning(
                    "ice %s: a datagram from %s broke aioice's reader (dropped; counted "
                    "from now on, not logged)",
                    self.connection.local_username,
                    addr,
                    exc_info=True,
                )
            return
        if data and data[0] > 3:  # not STUN (RFC 7983): DTLS or SRTP
            self._follow(addr)

    def _follow(self, addr: Address) -> None:
        """Move the selected pair to ``addr`` when its pair has succeeded (module rules)."""
        connection = self.connection
        component = self.local_candidate.component
        selected = connection._nominated.get(component)
        if selected is None or selected.remote_addr == addr:
            return
        for pair in connection._check_list:
            if pair.protocol is self and pair.state is _SUCCEEDED and pair.remote_addr == addr:
                pair.nominated = True
                connection._nominated[component] = pair
                self.counters.selected_pair_moves += 1
                logger.info(
                    "ice %s: selected pair moved %s -> %s (the publisher's media moved)",
                    connection.local_username,
                    selected.remote_addr,
                    addr,
                )
                return

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._lost:
            self._lost = True
            if self._on_lost is not None:
                self._on_lost(self)


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    for name in ("datagram_received", "connection_lost", "close", "send_stun", "request"):
        if not callable(getattr(StunProtocol, name, None)):
            problems.append(f"aioice.ice.StunProtocol.{name}")
    protocol_init = inspect.getsource(StunProtocol.__init__)
    if "self.receiver = receiver" not in protocol_init:
        problems.append("aioice.ice.StunProtocol.receiver")
    init = inspect.getsource(Connection.__init__)
    for name in ("_nominated", "_check_list"):
        if f"self.{name}" not in init:
            problems.append(f"aioice.ice.Connection.{name}")
    pair = getattr(aioice.ice, "CandidatePair", None)
    if pair is None or not isinstance(getattr(pair, "remote_addr", None), property):
        problems.append("aioice.ice.CandidatePair.remote_addr")
    elif "self.nominated = " not in inspect.getsource(pair.__init__):
        problems.append("aioice.ice.CandidatePair.nominated")
    return problems
