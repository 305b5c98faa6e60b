"""ICE-TCP's sans-IO core: which session a connection's first frame names, and the passive
candidates every answer advertises. No sockets, no clock: :mod:`whip.rtc.ice_tcp` feeds it
first frames and acts on the answer.

Rules:

- **Registration.** :meth:`IceTcpSessions.register` indexes a session's aioice
  ``Connection`` by its current local ufrag, with a label (the session id) for logs. A
  ufrag names one session at a time (:class:`UfragInUseError`: aioice's ufrags are 4
  characters). Registering the same connection again re-indexes it (after an ICE
  restart: the old ufrag stops matching). :meth:`IceTcpSessions.unregister` forgets it.
- **Verification** of a connection's first frame, in this order, each failure a
  :class:`TcpRefusal`: a structurally valid Binding request
  (:func:`whip.rtc.stun.read_binding_request`: at most 1500 bytes, header and attributes
  only, FINGERPRINT checked when present); a USERNAME ``<server ufrag>:<publisher ufrag>``;
  the server ufrag registered and still the connection's own (a connection whose
  credentials changed without a new registration matches nothing); the publisher part
  equal to the connection's remote ufrag once aioice knows it; MESSAGE-INTEGRITY present
  and verified with the connection's local password
  (:meth:`whip.rtc.stun.BindingRequest.integrity_matches`). The HMAC-SHA1 is computed only
  when the ufrag names a session, so the work per unverified frame is one bounded parse.
- **Candidates.** :func:`passive_candidates` makes one ``tcptype passive`` host candidate
  per address, all on the listening port, with RFC 6544 section 4.2 priorities: type
  preference 90 (below the 126 of every UDP host candidate the server advertises; it has
  no other kind), direction preference 4 (passive) in the top bits of the local
  preference, the address order below it. A :class:`PassiveTcpCandidate` never pairs by
  aioice's own rule (``can_pair_with`` is false), so aioice never starts a check of its own
  from it: passive never connects.
- **Threads.** Event loop thread only.

aioice internals relied on (:func:`internals_problems`): ``Connection._pair_remote_candidate``
asks the local candidate's ``can_pair_with``.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import aioice.ice
from aioice.candidate import Candidate, candidate_foundation
from aioice.ice import Connection

from whip.rtc.stun import StunFault, read_binding_request

TCP_HOST_TYPE_PREFERENCE = 90
"""RFC 6544 section 4.2: TCP host candidates rank below UDP host candidates (126)."""
PASSIVE_DIRECTION_PREFERENCE = 4
"""RFC 6544 section 4.2's recommended direction preference of a passive candidate."""


class TcpRefusal(enum.Enum):
    """Why the server closed an ICE-TCP connection (the values are metric labels). The
    ones from verification are this module's; the others are the listener's limits."""

    __hash__ = object.__hash__  # identity, as whip.rtc.stun.StunFault

    TOTAL_CAP = "total_cap"
    ADDRESS_CAP = "address_cap"
    OVERSIZE_FRAME = "oversize_frame"
    NOT_STUN = "not_stun"
    NOT_BINDING_REQUEST = "not_binding_request"
    MALFORMED = "malformed"
    BAD_FINGERPRINT = "bad_fingerprint"
    NO_USERNAME = "no_username"
    UNKNOWN_UFRAG = "unknown_ufrag"
    WRONG_REMOTE_UFRAG = "wrong_remote_ufrag"
    NO_INTEGRITY = "no_integrity"
    BAD_INTEGRITY = "bad_integrity"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    STREAM_ERROR = "stream_error"


_FAULT_REFUSALS = {
    StunFault.OVERSIZE: TcpRefusal.OVERSIZE_FRAME,
    StunFault.NOT_STUN: TcpRefusal.NOT_STUN,
    StunFault.NOT_BINDING_REQUEST: TcpRefusal.NOT_BINDING_REQUEST,
    StunFault.MALFORMED: TcpRefusal.MALFORMED,
    StunFault.BAD_FINGERPRINT: TcpRefusal.BAD_FINGERPRINT,
}


class UfragInUseError(ValueError):
    """Another registered session has the same local ufrag."""


class PassiveTcpCandidate(Candidate):
    """A ``tcptype passive`` host candidate: advertised, never paired by aioice's own
    rule (module rule "Candidates")."""

    def can_pair_with(self, other: Candidate) -> bool:
        return False


def passive_candidates(port: int, addresses: Sequence[str], component: int) -> list[Candidate]:
    """One passive candidate per address (duplicates dropped, order kept) on ``port``
    (module rule "Candidates")."""
    candidates: list[Candidate] = []
    for index, address in enumerate(dict.fromkeys(addresses)):
        local_preference = (PASSIVE_DIRECTION_PREFERENCE << 13) | (8191 - min(index, 8191))
        candidates.append(
            PassiveTcpCandidate(
                foundation=candidate_foundation("host", "tcp", address),
                component=component,
                transport="tcp",
                priority=(TCP_HOST_TYPE_PREFERENCE << 24)
                | (local_preference << 8)
                | (256 - component),
                host=address,
                port=port,
                type="host",
                tcptype="passive",
            )
        )
    return candidates


@dataclass(slots=True)
class _Registered:
    connection: Connection
    ufrag: str
    label: str


class IceTcpSessions:
    """The registered sessions (module rules). Loop thread only."""

    def __init__(self) -> None:
        self._by_ufrag: dict[str, _Registered] = {}
        self._by_connection: dict[int, _Registered] = {}

    def __len__(self) -> int:
        return len(self._by_connection)

    def register(self, connection: Connection, label: str = "") -> None:
        """Index ``connection`` by its current local ufrag (again after an ICE restart).
        Raises :class:`UfragInUseError` when another registered session has it."""
        ufrag = connection.local_username
        owner = self._by_ufrag.get(ufrag)
        if owner is not None and owner.connection is not connection:
            raise UfragInUseError(f"ICE ufrag {ufrag!r} is in use by session {owner.label}")
        previous = self._by_connection.get(id(connection))
        if previous is not None:
            self._by_ufrag.pop(previous.ufrag, None)
        entry = _Registered(connection, ufrag, label)
        self._by_ufrag[ufrag] = entry
        self._by_connection[id(connection)] = entry

    def unregister(self, connection: Connection) -> bool:
        """Forget ``connection``; whether it was registered (a second call is a no-op)."""
        entry = self._by_connection.pop(id(connection), None)
        if entry is None:
            return False
        if self._by_ufrag.get(entry.ufrag) is entry:
            del self._by_ufrag[entry.ufrag]
        return True

    def label_of(self, connection: Connection) -> str | None:
        """The label ``connection`` was registered with, if it is registered."""
        entry = self._by_connection.get(id(connection))
        return None if entry is None else entry.label

    def verify(self, frame: bytes) -> Connection | TcpRefusal:
        """The registered connection a first ``frame`` verifies for, or why none (module
        rule "Verification"). Never raises for any input."""
        request = read_binding_request(frame)
        if isinstance(request, StunFault):
            return _FAULT_REFUSALS[request]
        if request.username is None or b":" not in request.username:
            return TcpRefusal.NO_USERNAME
        server_ufrag, _, remote_ufrag = request.username.partition(b":")
        try:
            entry = self._by_ufrag.get(server_ufrag.decode("utf-8"))
        except UnicodeDecodeError:
            entry = None
        if entry is None or entry.connection.local_username != entry.ufrag:
            return TcpRefusal.UNKNOWN_UFRAG
        connection = entry.connection
        expected_remote = connection.remote_username
        if expected_remote is not None and remote_ufrag != expected_remote.encode("utf-8"):
            return TcpRefusal.WRONG_REMOTE_UFRAG
        if request.integrity_offset is None:
            return TcpRefusal.NO_INTEGRITY
        if not request.integrity_matches(connection.local_password.encode("utf-8")):
            return TcpRefusal.BAD_INTEGRITY
        return connection


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    pairing = getattr(aioice.ice.Connection, "_pair_remote_candidate", None)
    if pairing is None or "can_pair_with(" not in inspect.getsource(pairing):
        return ["aioice.ice.Connection._pair_remote_candidate: can_pair_with"]
    return []
