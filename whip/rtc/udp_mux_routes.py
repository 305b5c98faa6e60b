"""The routing table of the one-port UDP mux: which session a datagram belongs to (sans-IO).

Every session's ICE, DTLS and SRTP share one UDP socket; this table decides, per datagram
and its source address, which session's handle (the integration passes the session's
aioice ``Connection``) receives it. No sockets, no clock, no aioice state: the adapter
feeds it datagrams and acts on the answer.

Rules:

- **Registration.** A session registers its local ICE credentials (server ufrag and
  password), the publisher's ufrag when known, and a handle (any hashable object; it
  names the session). A server ufrag names one session at a time
  (:class:`UfragInUse` otherwise). :meth:`UdpMuxRoutes.unregister` at close removes the
  credentials and every address learned for that session.
- **Learned addresses** route with one dict lookup and no parsing:
  :meth:`UdpMuxRoutes.route` of a datagram from a learned address returns that
  address's session, unless the datagram starts with a Binding request's type (bytes
  0x00 0x01), which always takes the verifying path below, so a learned address can be
  re-bound and an unverified Binding request is never routed from anywhere.
- **Unknown addresses**: only a Binding request is considered (:mod:`whip.rtc.stun`:
  at most 1500 bytes, header and attributes only, FINGERPRINT checked when present).
  Its USERNAME must be ``<server ufrag>:<remote ufrag>`` of a registered session (the
  remote part must equal the publisher's ufrag when it was registered) and its
  MESSAGE-INTEGRITY must verify with that session's password. The HMAC-SHA1 is computed
  only when the USERNAME names a registered session. Only then is the address learned
  for that session and the datagram routed. Anything else (non-STUN bytes, DTLS, SRTP, a
  STUN response or indication, no or an unknown USERNAME, a bad or missing integrity, a
  malformed message) is dropped and counted by :class:`DropReason`; nothing unverified
  is ever routed or learned.
- **Re-binding.** An address learned for session A moves to session B only through a
  Binding request that verifies for B (A then loses it). A wrong password never
  re-binds; SRTP or DTLS from an address nobody verified is "unknown address, not STUN":
  dropped. A Binding request from a learned address that fails verification is dropped
  (its session would answer it 401 anyway) and the address stays with its session.
- **NAT rebinding and several candidates.** A session may hold several live addresses
  (ICE checks every candidate pair; a publisher behind a NAT that rebinds appears from a
  new port). A new address is learned when it sends a verified Binding request; the old
  one is *kept* until the session's cap evicts it or the session unregisters. Kept, not
  replaced: during ICE several pairs are checked at once and aioice picks the nominated
  one later, and the old path may still carry in-flight media; evicting it on the first
  verified request from elsewhere would cut a live pair. The old address is harmless:
  only that session receives from it, and it ages out by LRU.
- **Bounds.** The learned addresses are an LRU, capped per session
  (``max_addresses_per_session``, default 16) and in total (``max_addresses``, default
  4096): learning beyond a cap evicts the least recently used address (of that session
  for its cap, of anyone for the total cap). Every routed datagram refreshes its
  address's recency, so a live media path is the last to be evicted; a storm of verified
  requests from many ports (only a holder of a session's password can make one) evicts
  that session's own idle addresses first. Work per datagram from an unknown address is
  bounded by :mod:`whip.rtc.stun`'s reader plus at most one HMAC-SHA1.
- **ICE restart.** Registering a handle again replaces its credentials: the old ufrag
  stops matching at once (a Binding request naming it is "unknown ufrag", from any
  address), and every address already learned stays routed to the session.
- **Threads.** The table is used from the event loop thread only. :class:`UdpMuxCounters`
  are plain ints written by that thread and readable from any thread (``/metrics``);
  several tables of one loop may share one set (``counters=``).
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, fields

from whip.rtc.stun import BINDING_REQUEST_TYPE, BindingRequest, StunFault, read_binding_request

logger = logging.getLogger(__name__)

Address = tuple[str, int]
"""A remote ``(host, port)``; IPv6 four-tuples must be cut to two, as aioice does."""

DEFAULT_MAX_ADDRESSES = 4096
DEFAULT_MAX_ADDRESSES_PER_SESSION = 16


class DropReason(enum.Enum):
    """Why :meth:`UdpMuxRoutes.route` routed nothing (the values are metric labels)."""

    __hash__ = object.__hash__  # identity, as :class:`whip.rtc.stun.StunFault` says why

    OVERSIZE = "oversize"
    NOT_STUN = "not_stun"
    NOT_BINDING_REQUEST = "not_binding_request"
    MALFORMED = "malformed"
    BAD_FINGERPRINT = "bad_fingerprint"
    NO_USERNAME = "no_username"
    UNKNOWN_UFRAG = "unknown_ufrag"
    WRONG_REMOTE_UFRAG = "wrong_remote_ufrag"
    NO_INTEGRITY = "no_integrity"
    BAD_INTEGRITY = "bad_integrity"


_FAULT_REASONS = {fault: DropReason[fault.name] for fault in StunFault}
_DROP_COUNTERS = {reason: "dropped_" + reason.value for reason in DropReason}


class UfragInUse(ValueError):
    """The server ufrag already names another registered session (the caller must pick
    another one: aioice's default 4-character ufrags can collide across sessions)."""


@dataclass(slots=True)
class UdpMuxCounters:
    """What the table did, datagram by datagram (loop thread writes, any thread reads).

    ``routed_by_address``: routed by a learned address, not parsed. ``routed_verified``:
    routed after a Binding request verified (from an unknown or a learned address).
    ``addresses_learned``: new addresses; ``addresses_rebound``: moved from one session
    to another; ``evicted_session_cap`` / ``evicted_table_cap``: addresses dropped by the
    per-session / total cap. ``dropped_<reason>``: one per :class:`DropReason`.
    """

    routed_by_address: int = 0
    routed_verified: int = 0
    addresses_learned: int = 0
    addresses_rebound: int = 0
    evicted_session_cap: int = 0
    evicted_table_cap: int = 0
    dropped_oversize: int = 0
    dropped_not_stun: int = 0
    dropped_not_binding_request: int = 0
    dropped_malformed: int = 0
    dropped_bad_fingerprint: int = 0
    dropped_no_username: int = 0
    dropped_unknown_ufrag: int = 0
    dropped_wrong_remote_ufrag: int = 0
    dropped_no_integrity: int = 0
    dropped_bad_integrity: int = 0

    def dropped(self, reason: DropReason) -> int:
        """Datagrams dropped for ``reason``."""
        count: int = getattr(self, _DROP_COUNTERS[reason])
        return count

    def dropped_total(self) -> int:
        """Datagrams dropped for any reason."""
        return sum(self.dropped(reason) for reason in DropReason)

    def as_dict(self) -> dict[str, int]:
        """Every counter by its field name (one consistent-enough read for metrics)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Session[H: Hashable]:
    """One registered session: its credentials and its learned addresses, least
    recently used first (the values are unused)."""

    __slots__ = ("addresses", "handle", "key", "remote_ufrag", "routed", "ufrag")

    def __init__(self, handle: H, ufrag: bytes, key: bytes, remote_ufrag: bytes | None):
        self.handle = handle
        self.ufrag = ufrag
        self.key = key
        self.remote_ufrag = remote_ufrag
        self.addresses: OrderedDict[Address, None] = OrderedDict()
        self.routed: tuple[H, None] = (handle, None)


type RouteResult[H] = tuple[H, None] | tuple[None, DropReason]
"""``(handle, None)`` when routed, ``(None, reason)`` when dropped."""


def _credential(name: str, value: str) -> bytes:
    """A ufrag or password as the bytes STUN carries; empty or containing ``:`` (the
    USERNAME separator) is refused."""
    if not value or ":" in value:
        raise ValueError(f"ICE {name} must be non-empty and contain no ':'")
    return value.encode("utf-8")


class UdpMuxRoutes[H: Hashable]:
    """The routing table (module rules). Event loop thread only; ``counters`` may be
    read from any thread."""

    def __init__(
        self,
        *,
        max_addresses: int = DEFAULT_MAX_ADDRESSES,
        max_addresses_per_session: int = DEFAULT_MAX_ADDRESSES_PER_SESSION,
        counters: UdpMuxCounters | None = None,
    ) -> None:
        """``counters``: where this table counts (shared by several tables when given:
        the per-session sockets of ``ice.udp_mux = false`` each have a table and report
        one set of figures); a new set otherwise."""
        if max_addresses < 1 or max_addresses_per_session < 1:
            raise ValueError("the address caps must be at least 1")
        self.max_addresses = max_addresses
        self.max_addresses_per_session = max_addresses_per_session
        self.counters = UdpMuxCounters() if counters is None else counters
        self._learned: OrderedDict[Address, _Session[H]] = OrderedDict()
        self._by_ufrag: dict[bytes, _Session[H]] = {}
        self._by_handle: dict[H, _Session[H]] = {}
        self._dropped: dict[DropReason, tuple[None, DropReason]] = {
            reason: (None, reason) for reason in DropReason
        }

    # -- sessions ---------------------------------------------------------------------

    def register(
        self, handle: H, ufrag: str, password: str, remote_ufrag: str | None = None
    ) -> None:
        """Register ``handle``'s local ICE credentials (and the publisher's ufrag, checked
        in USERNAME when given). A handle already registered gets the new credentials
        (ICE restart): its old ufrag stops matching, its learned addresses stay.
        Raises :class:`UfragInUse` when ``ufrag`` names another session, ``ValueError``
        for an empty credential or one containing ``:``."""
        ufrag_bytes = _credential("ufrag", ufrag)
        key = _credential("password", password)
        remote = None if remote_ufrag is None else _credential("remote ufrag", remote_ufrag)
        owner = self._by_ufrag.get(ufrag_bytes)
        if owner is not None and owner.handle != handle:
            raise UfragInUse(f"ICE ufrag {ufrag!r} is in use by another session")
        session = self._by_handle.get(handle)
        if session is None:
            session = _Session(handle, ufrag_bytes, key, remote)
            self._by_handle[handle] = session
        else:
            del self._by_ufrag[session.ufrag]
            session.ufrag, session.key, session.remote_ufrag = ufrag_bytes, key, remote
            logger.info("udp mux: %r ICE credentials replaced", handle)
        self._by_ufrag[ufrag_bytes] = session

    def unregister(self, handle: H) -> bool:
        """Forget ``handle``: its credentials and every address learned for it. Returns
        whether it was registered (a second call is a no-op)."""
        session = self._by_handle.pop(handle, None)
        if session is None:
            return False
        del self._by_ufrag[session.ufrag]
        for addr in session.addresses:
            del self._learned[addr]
        session.addresses.clear()
        return True

    def __contains__(self, handle: object) -> bool:
        return handle in self._by_handle

    def __len__(self) -> int:
        """Registered sessions."""
        return len(self._by_handle)

    def addresses_of(self, handle: H) -> list[Address]:
        """The addresses learned for ``handle``, least recently used first."""
        session = self._by_handle.get(handle)
        return [] if session is None else list(session.addresses)

    def owner_of(self, addr: Address) -> H | None:
        """The handle ``addr`` is learned for, if any (does not refresh recency)."""
        session = self._learned.get(addr)
        return None if session is None else session.handle

    @property
    def learned_addresses(self) -> int:
        """Addresses in the table, all sessions."""
        return len(self._learned)

    # -- datagrams --------------------------------------------------------------------

    def route(self, datagram: bytes, addr: Address) -> RouteResult[H]:
        """The session ``datagram`` from ``addr`` belongs to: ``(handle, None)``, or
        ``(None, reason)`` when it is dropped (module rules). Never raises."""
        session = self._learned.get(addr)
        if session is not None and not datagram.startswith(BINDING_REQUEST_TYPE):
            self._learned.move_to_end(addr)
            session.addresses.move_to_end(addr)
            self.counters.routed_by_address += 1
            return session.routed
        return self._route_binding_request(datagram, addr, session)

    def _route_binding_request(
        self, datagram: bytes, addr: Address, bound: _Session[H] | None
    ) -> RouteResult[H]:
        """Verify a Binding request (or drop what is not one); learn or re-bind ``addr``
        for the session it verifies for."""
        request = read_binding_request(datagram)
        if isinstance(request, StunFault):
            return self._drop(_FAULT_REASONS[request])
        verified = self._verify(request)
        if isinstance(verified, DropReason):
            return self._drop(verified)
        if bound is verified:
            self._learned.move_to_end(addr)
            verified.addresses.move_to_end(addr)
        else:
            if bound is not None:
                del bound.addresses[addr]
                del self._learned[addr]
                self.counters.addresses_rebound += 1
                logger.warning(
                    "udp mux: %s re-bound from %r to %r by a verified binding request",
                    addr,
                    bound.handle,
                    verified.handle,
                )
            else:
                self.counters.addresses_learned += 1
            self._learn(addr, verified)
        self.counters.routed_verified += 1
        return verified.routed

    def _verify(self, request: BindingRequest) -> _Session[H] | DropReason:
        """The session whose credentials ``request`` carries, or why none."""
        if request.username is None:
            return DropReason.NO_USERNAME
        server_ufrag, colon, remote_ufrag = request.username.partition(b":")
        if not colon:
            return DropReason.NO_USERNAME
        session = self._by_ufrag.get(server_ufrag)
        if session is None:
            return DropReason.UNKNOWN_UFRAG
        if session.remote_ufrag is not None and remote_ufrag != session.remote_ufrag:
            return DropReason.WRONG_REMOTE_UFRAG
        if request.integrity_offset is None:
            return DropReason.NO_INTEGRITY
        if not request.integrity_matches(session.key):
            return DropReason.BAD_INTEGRITY
        return session

    def _learn(self, addr: Address, session: _Session[H]) -> None:
        """Add ``addr`` for ``session`` as most recently used, evicting by the caps."""
        if len(session.addresses) >= self.max_addresses_per_session:
            oldest, _ = session.addresses.popitem(last=False)
            del self._learned[oldest]
            self.counters.evicted_session_cap += 1
        elif len(self._learned) >= self.max_addresses:
            oldest, owner = self._learned.popitem(last=False)
            del owner.addresses[oldest]
            self.counters.evicted_table_cap += 1
        self._learned[addr] = session
        session.addresses[addr] = None

    def _drop(self, reason: DropReason) -> tuple[None, DropReason]:
        """Count a drop and answer it."""
        name = _DROP_COUNTERS[reason]
        setattr(self.counters, name, getattr(self.counters, name) + 1)
        return self._dropped[reason]
