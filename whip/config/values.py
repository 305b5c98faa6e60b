"""Checks of single values: addresses, networks, ICE server URLs, processor specs, the
video codec preference list.

Rules:

- Each check takes an already typed value and raises :class:`InvalidValue` with a message
  that reads after the key's name (``must be ...``, ``'x' is not ...``); it returns nothing.
- Pure: no name resolution, no sockets. A host name is checked for its syntax only.
- ``server.host`` is an IP address or a host name; ``server.public_hosts`` are IP
  addresses only (ICE candidates carry addresses), each at most once.
- Loopback (:func:`is_loopback`) is ``localhost``, 127.0.0.0/8 and ::1, also bracketed or
  IPv4-mapped: the only hosts the server serves without principals.
- An ICE server is a ``stun:``/``stuns:``/``turn:``/``turns:`` URL (RFC 7064/7065); STUN
  takes no ``?transport``; TURN needs a username and a credential.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from whip.config.errors import InvalidValue

_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9-]+)*"
)
_ICE_URL = re.compile(
    r"(?P<scheme>stuns?|turns?):(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
    r"(?::(?P<port>\d{1,5}))?(?:\?transport=(?P<transport>udp|tcp))?"
)
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_PROCESSOR = re.compile(rf"{_DOTTED}:{_DOTTED}")


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (bracketed or IPv4-mapped too)."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def check_host(host: str) -> None:
    """An IP address or a syntactically valid host name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.fullmatch(host):
            raise InvalidValue(f"must be an IP address or a host name, got {host!r}") from None


def check_public_hosts(hosts: tuple[str, ...]) -> None:
    """IP addresses only, none twice (``::1`` and ``0::1`` are the same address)."""
    for host in hosts:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidValue(
                f"{host!r} is not an IP address (candidates carry addresses)"
            ) from None
    if len(set(map(ipaddress.ip_address, hosts))) != len(hosts):
        raise InvalidValue("lists an address twice")


def check_networks(networks: tuple[str, ...]) -> None:
    """Addresses or networks (host bits allowed: ``10.0.0.1/8`` means ``10.0.0.0/8``)."""
    for spec in networks:
        try:
            ipaddress.ip_network(spec, strict=False)
        except ValueError:
            raise InvalidValue(f"{spec!r} is not an IP address or network") from None


def check_processors(processors: tuple[str, ...]) -> None:
    """``package.module:attribute`` specs (whether they import is checked at start-up)."""
    for spec in processors:
        if not _PROCESSOR.fullmatch(spec):
            raise InvalidValue(f"{spec!r} is not 'package.module:attribute'")


def check_video_codecs(codecs: tuple[str, ...]) -> None:
    """A preference list: at least one format, none twice."""
    if not codecs:
        raise InvalidValue("must name at least one video codec")
    twice = sorted({c for c in codecs if codecs.count(c) > 1})
    if twice:
        raise InvalidValue(f"lists {', '.join(twice)} more than once")


@dataclass(frozen=True, slots=True)
class IceServer:
    """A STUN or TURN URL (RFC 7064/7065); TURN needs ``username`` and ``credential``."""

    url: str
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        match = _ICE_URL.fullmatch(self.url)
        if match is None:
            raise InvalidValue(f"{self.url!r} is not a stun:, stuns:, turn: or turns: URL")
        if match["port"] is not None and not 0 < int(match["port"]) <= 65535:
            raise InvalidValue(f"{self.url!r} has a bad port")
        if match["scheme"].startswith("stun") and match["transport"] is not None:
            raise InvalidValue(f"{self.url!r}: STUN URLs take no ?transport")
        if match["scheme"].startswith("turn") and not (self.username and self.credential):
            raise InvalidValue(f"{self.url!r}: TURN needs username and credential (file only)")
