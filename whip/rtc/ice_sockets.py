"""The hook: which UDP sockets the server's ICE connections gather on.

aioice opens one ephemeral UDP socket per host address in
``Connection.get_component_candidates``. :func:`install_socket_hook` replaces that method,
process-wide, with one that asks the connection's :class:`IceSocketProvider` (the shared
port of :mod:`whip.rtc.udp_mux`, or the per-session sockets within a port range of
:mod:`whip.rtc.session_sockets`) and falls back to aioice's own code for every other
connection.

Rules:

- **Who is served.** Only connections :func:`use_ice_sockets` marked: the server's
  negotiation (:mod:`whip.negotiation`) marks each ICE connection of its peer after
  ``setRemoteDescription`` (BUNDLE has dropped the extra transports) and before
  ``setLocalDescription`` gathers. The mark is an attribute on the aioice ``Connection``
  naming its provider, so several servers in one process (tests) each keep their own
  provider, and publishers in the same process (tests, benches), never marked, keep
  aioice's own sockets.
- **Credentials.** Marking also gives the connection a 16-character ufrag (aioice's
  default is 4 characters: 62^4 values, a collision among a few hundred sessions on one
  port is not negligible). The provider registers the connection's credentials when it
  gathers; :func:`refresh_ice_credentials` registers them again after they changed (ICE
  restart). A ufrag that still collides is :class:`IceCredentialsInUseError`, 503: a
  failed negotiation, retried by the publisher.
- **Close.** The provider's sockets (or its views of the shared one) are closed by
  ``Connection.close`` like aioice's own; every path that ends a session closes its peer
  connection, so every path unregisters.
- **Exactly one install.** :func:`install_socket_hook` is idempotent; the hook is inert
  for unmarked connections, so it never needs undoing.

aioice/aiortc internals touched: ``aioice.ice.Connection.get_component_candidates`` (the
replaced method), ``Connection._local_username`` (the longer ufrag, read back through the
public ``local_username``), ``aiortc.RTCIceGatherer._connection`` (the gatherer's aioice
connection).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Protocol

import aioice.ice
from aioice.candidate import Candidate
from aioice.ice import Connection
from aioice.utils import random_string
from aiortc import RTCIceGatherer, RTCPeerConnection

from whip.errors import HttpError

logger = logging.getLogger(__name__)

SERVER_UFRAG_LENGTH = 16
_PROVIDER_ATTRIBUTE = "_whip_ice_sockets"
_stock_get_component_candidates = Connection.get_component_candidates


class IceCredentialsInUseError(HttpError):
    """The session's ICE ufrag names another live session on the shared port (module
    rules: practically never with 16 random characters)."""

    http_status = 503
    code = "ice_credentials_in_use"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})


class IceSocketProvider(Protocol):
    """Where a marked connection's host candidates live (module rules)."""

    async def component_candidates(
        self, connection: Connection, component: int, addresses: list[str]
    ) -> list[Candidate]:
        """Open (or attach to) the sockets of ``component`` on ``addresses``, add their
        protocols to the connection and return their host candidates."""
        ...

    def refresh_credentials(self, connection: Connection) -> None:
        """Register ``connection``'s current local credentials again."""
        ...

    def publisher_closing(self, connection: Connection) -> int:
        """The server is about to close ``connection``'s session (not at the publisher's
        request): make the publisher's connected UDP socket fail as a closed port does
        (:mod:`whip.rtc.port_unreachable`); the messages sent."""
        ...


async def _get_component_candidates(
    self: Connection,
    component: int,
    addresses: list[str],
    timeout: int = 5,  # noqa: ASYNC109 (aioice's signature)
) -> list[Candidate]:
    """The replacement of ``Connection.get_component_candidates`` (module rules)."""
    provider: IceSocketProvider | None = getattr(self, _PROVIDER_ATTRIBUTE, None)
    if provider is None:
        return await _stock_get_component_candidates(self, component, addresses, timeout)
    return await provider.component_candidates(self, component, addresses)


def install_socket_hook() -> None:
    """Replace ``Connection.get_component_candidates`` (idempotent, process-wide)."""
    hook: Any = _get_component_candidates
    aioice.ice.Connection.get_component_candidates = hook  # type: ignore[method-assign]


def ice_connections(pc: RTCPeerConnection) -> list[Connection]:
    """The distinct aioice connections of ``pc``'s receivers (one with BUNDLE), once
    ``setRemoteDescription`` has made the transceivers."""
    seen: dict[int, Connection] = {}
    for transceiver in pc.getTransceivers():
        gatherer = transceiver.receiver.transport.transport.iceGatherer
        connection: Connection = gatherer._connection
        seen[id(connection)] = connection
    return list(seen.values())


def use_ice_sockets(pc: RTCPeerConnection, provider: IceSocketProvider) -> None:
    """Mark every ICE connection of ``pc`` for ``provider`` and give it a long ufrag
    (module rules). Call after ``setRemoteDescription``, before ``setLocalDescription``."""
    install_socket_hook()
    for connection in ice_connections(pc):
        connection._local_username = random_string(SERVER_UFRAG_LENGTH)
        setattr(connection, _PROVIDER_ATTRIBUTE, provider)


def refresh_ice_credentials(connection: Connection) -> None:
    """Register ``connection``'s current local ufrag and password with its provider
    again (after an ICE restart gave it new ones): from now on only the new ufrag routes
    to it, and the addresses already verified stay routed. A connection the server did
    not mark is left alone. Raises :class:`IceCredentialsInUseError` when the new ufrag
    names another session."""
    provider: IceSocketProvider | None = getattr(connection, _PROVIDER_ATTRIBUTE, None)
    if provider is not None:
        provider.refresh_credentials(connection)


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    method = getattr(Connection, "get_component_candidates", None)
    if not inspect.iscoroutinefunction(method):
        problems.append("aioice.ice.Connection.get_component_candidates")
    elif (
        method is not _get_component_candidates
        and "addresses" not in inspect.signature(method).parameters
    ):
        problems.append("aioice.ice.Connection.get_component_candidates(addresses)")
    gather = inspect.getsource(Connection.gather_candidates)
    if "self.get_component_candidates(" not in gather:
        problems.append("aioice.ice.Connection.gather_candidates")
    init = inspect.getsource(Connection.__init__)
    for name in ("_local_username", "_protocols"):
        if f"self.{name}" not in init:
            problems.append(f"aioice.ice.Connection.{name}")
    if "self._connection = Connection(" not in inspect.getsource(RTCIceGatherer.__init__):
        problems.append("aiortc.RTCIceGatherer._connection")
    return problems
