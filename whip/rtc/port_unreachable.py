"""ICMP port unreachable for a publisher whose session the server ends on the shared UDP port.

Why: FFmpeg's WHIP muxer (the FFmpeg 8 of PyAV 19, seen with ``strace``) sends on a
connected UDP socket and reads it before each packet. Once it has read the server's DTLS
close_notify its reads block, it sends one packet per datagram it receives, and it
swallows a read error; its push ends only when a read in its normal, non-blocking loop
fails. With a socket per session that failure comes by itself: the kernel answers the
publisher's next datagram to the closed port with an ICMP port unreachable, and the
publisher's kernel turns it into ``ECONNREFUSED`` on that connected socket. On the shared
port the port stays open, so the publisher would hang until killed. The server therefore
sends the ICMP the kernel would have sent, before it closes the session.

Rules:

- **What is sent.** To each address the shared port's route table learned for the session,
  one ICMP destination unreachable / port unreachable (IPv4 type 3 code 3, IPv6 type 1
  code 4) quoting the header of a UDP datagram from that address and port to each of the
  session's server addresses of that family and the shared port: what the kernel quotes
  when it refuses a datagram. The publisher's kernel gives it to the socket connected to
  that 4-tuple; a socket that is not connected (libwebrtc, libdatachannel, aioice) does not
  see it (Linux reports ICMP errors on unconnected UDP sockets only with ``IP_RECVERR``).
  Through a NAT the quoted header is what the NAT translates back.
- **When.** Before the DTLS close_notify of a close the server decides (stop, supersede,
  fault, shutdown, a silent peer): the publisher's next read fails at once, before it can
  read the close_notify. Never for the publisher's own DELETE or its clean end
  (:data:`SIGNALLED_REASONS` in :mod:`whip.session_manager`).
- **Only with a raw socket.** Opening one needs ``CAP_NET_RAW`` (root, or the capability;
  Docker's default set has it). Without it nothing is sent, and the start-up log says once
  what that means. Each family's socket is opened at most once, on first use.
- **Never raises.** Sends are non-blocking; a failure (``ENOBUFS``, a firewall's ``EPERM``)
  is counted (``failed``) and logged at debug. Event loop thread only.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable

logger = logging.getLogger(__name__)

Address = tuple[str, int]

_ICMP4_UNREACHABLE, _ICMP4_PORT = 3, 3
_ICMP6_UNREACHABLE, _ICMP6_PORT = 1, 4
_UDP = 17
_TTL = 64
_UDP_HEADER = struct.Struct("!HHHH")


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total >> 16) + (total & 0xFFFF)
    return ~total & 0xFFFF


def _quoted_udp(publisher_port: int, server_port: int) -> bytes:
    """The UDP header of a datagram from the publisher to the server, as quoted (length 8:
    a header without data, checksum 0: optional for IPv4 and not verified in a quote)."""
    return _UDP_HEADER.pack(publisher_port, server_port, _UDP_HEADER.size, 0)


def icmp4_port_unreachable(publisher: Address, server: Address) -> bytes:
    """The ICMP message (after the IP header the kernel adds) telling ``publisher`` that
    its datagrams to ``server`` reach no socket: type 3 code 3, quoting an IPv4 header
    and the UDP header of such a datagram (RFC 792)."""
    quoted_ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,  # version 4, header of 5 words
        0,
        20 + _UDP_HEADER.size,
        0,
        0,
        _TTL,
        _UDP,
        0,
        socket.inet_aton(publisher[0]),
        socket.inet_aton(server[0]),
    )
    quoted_ip = quoted_ip[:10] + struct.pack("!H", _checksum(quoted_ip)) + quoted_ip[12:]
    body = quoted_ip + _quoted_udp(publisher[1], server[1])
    header = struct.pack("!BBHI", _ICMP4_UNREACHABLE, _ICMP4_PORT, 0, 0)
    checksum = _checksum(header + body)
    return struct.pack("!BBHI", _ICMP4_UNREACHABLE, _ICMP4_PORT, checksum, 0) + body


def icmp6_port_unreachable(publisher: Address, server: Address) -> bytes:
    """The ICMPv6 message telling ``publisher`` that its datagrams to ``server`` reach no
    socket: type 1 code 4, quoting an IPv6 header and the UDP header (RFC 4443). The
    checksum is left 0: the kernel computes it for raw ICMPv6 sockets (RFC 3542)."""
    quoted_ip = struct.pack(
        "!IHBB16s16s",
        6 << 28,
        _UDP_HEADER.size,
        _UDP,
        _TTL,
        socket.inet_pton(socket.AF_INET6, _bare(publisher[0])),
        socket.inet_pton(socket.AF_INET6, _bare(server[0])),
    )
    body = quoted_ip + _quoted_udp(publisher[1], server[1])
    return struct.pack("!BBHI", _ICMP6_UNREACHABLE, _ICMP6_PORT, 0, 0) + body


def _bare(host: str) -> str:
    """``host`` without an IPv6 zone (``fe80::1%eth0``)."""
    return host.split("%", 1)[0]


def _family(host: str) -> socket.AddressFamily:
    version = ipaddress.ip_address(_bare(host)).version
    return socket.AF_INET6 if version == 6 else socket.AF_INET


class PortUnreachable:
    """The raw ICMP sockets and what went through them (module rules)."""

    def __init__(self) -> None:
        self._sockets: dict[socket.AddressFamily, socket.socket | None] = {}
        self.sent = 0
        self.failed = 0

    def available(self, family: socket.AddressFamily = socket.AF_INET) -> bool:
        """Whether ``family``'s raw socket is open (opening it on first use)."""
        return self._socket(family) is not None

    def _socket(self, family: socket.AddressFamily) -> socket.socket | None:
        if family in self._sockets:
            return self._sockets[family]
        protocol = socket.IPPROTO_ICMPV6 if family == socket.AF_INET6 else socket.IPPROTO_ICMP
        opened: socket.socket | None
        try:
            opened = socket.socket(family, socket.SOCK_RAW, protocol)
            opened.setblocking(False)
        except OSError as exc:
            opened = None
            logger.info(
                "udp mux: no raw %s socket (%s): a publisher whose session the server "
                "ends is told only by DTLS close_notify (FFmpeg's WHIP muxer then waits "
                "until it is killed; docs/INTEROP.md, 'The ICE sockets')",
                family.name,
                exc.strerror or exc,
            )
        self._sockets[family] = opened
        return opened

    def send(self, publishers: Iterable[Address], servers: Iterable[Address]) -> int:
        """Tell each of ``publishers`` that its datagrams to each of ``servers`` of its
        family reach no socket (module rules); the number of messages sent."""
        targets = list(servers)
        count = 0
        for publisher in publishers:
            family = _family(publisher[0])
            for server in targets:
                if _family(server[0]) != family:
                    continue
                raw = self._socket(family)
                if raw is None:
                    continue
                message = (
                    icmp6_port_unreachable(publisher, server)
                    if family == socket.AF_INET6
                    else icmp4_port_unreachable(publisher, server)
                )
                try:
                    raw.sendto(message, (publisher[0], 0))
                except OSError as exc:
                    self.failed += 1
                    logger.debug("udp mux: port unreachable to %s failed: %s", publisher, exc)
                    continue
                self.sent += 1
                count += 1
        return count

    def close(self) -> None:
        """Close the raw sockets (idempotent)."""
        for raw in self._sockets.values():
            if raw is not None:
                raw.close()
        self._sockets = {}
