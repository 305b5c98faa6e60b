"""The one-port UDP mux's routing table (:mod:`whip.rtc.udp_mux_routes`) and its STUN
reader (:mod:`whip.rtc.stun`).

Binding requests are built and signed with :mod:`aioice.stun` (the code an aiortc
publisher signs its own with); one is captured off the wire from a real aiortc peer
connection on loopback, so the format is the real one.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from typing import Any

import aioice.ice
import pytest
from aioice import stun
from hypothesis import given, settings
from hypothesis import strategies as st

from whip.rtc.host_addresses import restrict_host_addresses
from whip.rtc.peer import new_peer_connection
from whip.rtc.stun import BindingRequest, StunFault, read_binding_request
from whip.rtc.udp_mux_routes import DropReason, UdpMuxRoutes, UfragInUse

A_UFRAG, A_PWD, A_REMOTE = "srvA", "server-password-of-a-22", "pubA"
B_UFRAG, B_PWD, B_REMOTE = "srvB", "server-password-of-b-22", "pubB"
PUBLISHER_A = ("192.0.2.10", 50000)
PUBLISHER_B = ("192.0.2.20", 50000)
STRANGER = ("198.51.100.7", 40000)
SRTP = bytes([0x80, 0x60, 0x00, 0x01]) + bytes(8) + b"\xab" * 100
DTLS_CLIENT_HELLO = bytes([0x16, 0xFE, 0xFD]) + bytes(10) + b"\x01" * 60


def binding_request(
    username: str | None = f"{A_UFRAG}:{A_REMOTE}",
    password: str | None = A_PWD,
    *,
    fingerprint: bool = True,
    method: stun.Method = stun.Method.BINDING,
    message_class: stun.Class = stun.Class.REQUEST,
) -> bytes:
    """A connectivity check as aioice builds one (PRIORITY, ICE-CONTROLLING,
    USE-CANDIDATE), signed with ``password`` and (by default) fingerprinted."""
    message = stun.Message(message_method=method, message_class=message_class)
    if username is not None:
        message.attributes["USERNAME"] = username
    message.attributes["PRIORITY"] = 1853824767
    message.attributes["ICE-CONTROLLING"] = 0x1122334455667788
    message.attributes["USE-CANDIDATE"] = None
    if password is not None:
        message.add_message_integrity(password.encode("utf-8"))
        if not fingerprint:
            del message.attributes["FINGERPRINT"]
    elif fingerprint:
        message.add_fingerprint()
    return bytes(message)


def two_sessions(**caps: int) -> UdpMuxRoutes[str]:
    """Sessions "A" and "B" registered with their publishers' ufrags."""
    routes: UdpMuxRoutes[str] = UdpMuxRoutes(**caps)
    routes.register("A", A_UFRAG, A_PWD, A_REMOTE)
    routes.register("B", B_UFRAG, B_PWD, B_REMOTE)
    return routes


def request_of_b() -> bytes:
    return binding_request(f"{B_UFRAG}:{B_REMOTE}", B_PWD)


def port(n: int) -> tuple[str, int]:
    return ("192.0.2.99", 10000 + n)


# -- learning and routing ---------------------------------------------------------------


def test_a_verified_binding_request_learns_its_address_then_media_routes_by_address() -> None:
    routes = two_sessions()
    assert routes.route(binding_request(), PUBLISHER_A) == ("A", None)
    assert routes.owner_of(PUBLISHER_A) == "A"
    for datagram in (SRTP, DTLS_CLIENT_HELLO, b"", b"\x00"):
        assert routes.route(datagram, PUBLISHER_A) == ("A", None)
    counters = routes.counters
    assert (counters.routed_verified, counters.addresses_learned) == (1, 1)
    assert counters.routed_by_address == 4
    assert counters.dropped_total() == 0


def test_a_request_without_fingerprint_is_accepted_and_one_with_ipv6_address() -> None:
    routes = two_sessions()
    addr = ("2001:db8::5", 5000)
    assert routes.route(binding_request(fingerprint=False), addr) == ("A", None)
    assert routes.addresses_of("A") == [addr]


def test_stun_responses_and_indications_from_a_learned_address_go_to_its_session() -> None:
    """aioice matches responses to its own transactions (and checks their integrity):
    from a learned address they are routed by address like any other datagram."""
    routes = two_sessions()
    routes.route(binding_request(), PUBLISHER_A)
    response = binding_request(message_class=stun.Class.RESPONSE)
    indication = binding_request(message_class=stun.Class.INDICATION)
    assert routes.route(response, PUBLISHER_A) == ("A", None)
    assert routes.route(indication, PUBLISHER_A) == ("A", None)
    assert routes.counters.routed_by_address == 2


def test_a_binding_request_from_a_learned_address_is_verified_again() -> None:
    routes = two_sessions()
    routes.route(binding_request(), PUBLISHER_A)
    assert routes.route(binding_request(), PUBLISHER_A) == ("A", None)  # consent check
    assert routes.route(binding_request(password="guess"), PUBLISHER_A) == (
        None,
        DropReason.BAD_INTEGRITY,
    )
    assert routes.owner_of(PUBLISHER_A) == "A"  # a failed check does not unbind it
    assert routes.route(SRTP, PUBLISHER_A) == ("A", None)
    assert (routes.counters.routed_verified, routes.counters.addresses_learned) == (2, 1)


# -- what an unknown address cannot do --------------------------------------------------


def _attribute_after_fingerprint() -> bytes:
    data = binding_request()
    extra = struct.pack("!HH", 0x8022, 4) + b"soft"  # SOFTWARE after FINGERPRINT
    return data[:2] + struct.pack("!H", len(data) - 20 + len(extra)) + data[4:] + extra


def _integrity_of_wrong_length() -> bytes:
    data = bytearray(binding_request(fingerprint=False))
    mi = len(data) - 24  # MESSAGE-INTEGRITY is the last attribute without FINGERPRINT
    assert data[mi : mi + 4] == struct.pack("!HH", 0x0008, 20)
    data[mi + 2 : mi + 4] = struct.pack("!H", 16)
    data[mi + 20 : mi + 24] = struct.pack("!HH", 0x8022, 0)  # keep the length honest
    return bytes(data)


def _attribute_overrunning_the_message() -> bytes:
    data = bytearray(binding_request(fingerprint=False))
    data[22:24] = struct.pack("!H", 2000)  # the first attribute claims 2000 bytes
    return bytes(data)


def _bad_fingerprint() -> bytes:
    data = bytearray(binding_request())
    data[-1] ^= 0xFF
    return bytes(data)


def _wrong_cookie() -> bytes:
    data = bytearray(binding_request())
    data[4] ^= 0x01
    return bytes(data)


def _length_not_multiple_of_four() -> bytes:
    data = binding_request(fingerprint=False) + b"\x00\x00"
    return data[:2] + struct.pack("!H", len(data) - 20) + data[4:]


UNKNOWN_ADDRESS_DROPS: list[tuple[str, bytes, DropReason]] = [
    ("srtp", SRTP, DropReason.NOT_STUN),
    ("dtls", DTLS_CLIENT_HELLO, DropReason.NOT_STUN),
    ("empty", b"", DropReason.NOT_STUN),
    ("short", b"\x00\x01\x00\x00", DropReason.NOT_STUN),
    ("cookie", _wrong_cookie(), DropReason.NOT_STUN),
    ("oversize", binding_request()[:20] + bytes(1481), DropReason.OVERSIZE),
    (
        "response",
        binding_request(message_class=stun.Class.RESPONSE),
        DropReason.NOT_BINDING_REQUEST,
    ),
    ("error", binding_request(message_class=stun.Class.ERROR), DropReason.NOT_BINDING_REQUEST),
    (
        "indication",
        binding_request(message_class=stun.Class.INDICATION),
        DropReason.NOT_BINDING_REQUEST,
    ),
    ("allocate", binding_request(method=stun.Method.ALLOCATE), DropReason.NOT_BINDING_REQUEST),
    ("truncated", binding_request()[:-4], DropReason.MALFORMED),
    ("unaligned", _length_not_multiple_of_four(), DropReason.MALFORMED),
    ("overrun", _attribute_overrunning_the_message(), DropReason.MALFORMED),
    ("integrity_length", _integrity_of_wrong_length(), DropReason.MALFORMED),
    ("after_fingerprint", _attribute_after_fingerprint(), DropReason.MALFORMED),
    ("fingerprint", _bad_fingerprint(), DropReason.BAD_FINGERPRINT),
    ("no_username", binding_request(username=None), DropReason.NO_USERNAME),
    ("no_colon", binding_request(username=A_UFRAG), DropReason.NO_USERNAME),
    ("unknown_ufrag", binding_request(f"nope:{A_REMOTE}"), DropReason.UNKNOWN_UFRAG),
    ("remote_swapped", binding_request(f"{A_REMOTE}:{A_UFRAG}"), DropReason.UNKNOWN_UFRAG),
    ("wrong_remote", binding_request(f"{A_UFRAG}:other"), DropReason.WRONG_REMOTE_UFRAG),
    ("no_integrity", binding_request(password=None), DropReason.NO_INTEGRITY),
    ("bad_integrity", binding_request(password="not-the-password"), DropReason.BAD_INTEGRITY),
    ("other_sessions_password", binding_request(password=B_PWD), DropReason.BAD_INTEGRITY),
]


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [(d, r) for _, d, r in UNKNOWN_ADDRESS_DROPS],
    ids=[name for name, _, _ in UNKNOWN_ADDRESS_DROPS],
)
def test_from_an_unknown_address_only_a_verified_binding_request_is_routed(
    datagram: bytes, reason: DropReason
) -> None:
    routes = two_sessions()
    assert routes.route(datagram, STRANGER) == (None, reason)
    assert routes.owner_of(STRANGER) is None and routes.learned_addresses == 0
    counters = routes.counters
    assert counters.dropped(reason) == 1 and counters.dropped_total() == 1
    assert counters.routed_by_address == counters.routed_verified == 0


def test_every_drop_reason_has_a_counter_and_a_case() -> None:
    assert {r for _, _, r in UNKNOWN_ADDRESS_DROPS} == set(DropReason)
    counters = two_sessions().counters
    assert all(counters.dropped(reason) == 0 for reason in DropReason)
    assert set(counters.as_dict()) >= {"dropped_" + r.value for r in DropReason}


def test_a_username_after_message_integrity_is_not_authenticated_so_it_does_not_count() -> None:
    message = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
    message.attributes["PRIORITY"] = 1
    message.add_message_integrity(A_PWD.encode())
    del message.attributes["FINGERPRINT"]
    message.attributes["USERNAME"] = f"{A_UFRAG}:{A_REMOTE}"  # follows MESSAGE-INTEGRITY
    data = bytes(message)
    request = read_binding_request(data)
    assert isinstance(request, BindingRequest) and request.integrity_matches(A_PWD.encode())
    assert two_sessions().route(data, STRANGER) == (None, DropReason.NO_USERNAME)


def test_of_a_repeated_username_the_first_counts() -> None:
    good = binding_request(fingerprint=False)  # FINGERPRINT would cover the insert
    request = read_binding_request(good)
    assert isinstance(request, BindingRequest) and request.username == b"srvA:pubA"
    first = struct.pack("!HH", 0x0006, 9) + b"srvB:pubB" + bytes(3)
    data = good[:20] + first + good[20:]
    data = data[:2] + struct.pack("!H", len(data) - 20) + data[4:]
    parsed = read_binding_request(data)
    assert isinstance(parsed, BindingRequest) and parsed.username == b"srvB:pubB"


def test_the_session_of_the_remote_ufrag_is_not_checked_when_none_was_registered() -> None:
    routes: UdpMuxRoutes[str] = UdpMuxRoutes()
    routes.register("A", A_UFRAG, A_PWD)
    assert routes.route(binding_request(f"{A_UFRAG}:anything"), STRANGER) == ("A", None)


# -- spoofing and re-binding ------------------------------------------------------------


def test_a_publisher_cannot_take_over_another_sessions_media() -> None:
    routes = two_sessions()
    routes.route(binding_request(), PUBLISHER_A)
    routes.route(request_of_b(), PUBLISHER_B)
    # B's publisher knows A's ufrags (say) but not A's password: from its own address,
    # and from A's address (a spoofed source).
    forged = binding_request(password=B_PWD)
    assert routes.route(forged, PUBLISHER_B) == (None, DropReason.BAD_INTEGRITY)
    assert routes.route(forged, PUBLISHER_A) == (None, DropReason.BAD_INTEGRITY)
    assert routes.route(forged, STRANGER) == (None, DropReason.BAD_INTEGRITY)
    # SRTP from an address nobody verified is not STUN: dropped, never routed.
    assert routes.route(SRTP, STRANGER) == (None, DropReason.NOT_STUN)
    assert routes.addresses_of("A") == [PUBLISHER_A]
    assert routes.addresses_of("B") == [PUBLISHER_B]
    assert routes.counters.addresses_rebound == 0


def test_a_verified_request_of_another_session_re_binds_the_address() -> None:
    """A NAT that gives A's old port to B's publisher: B's verified check moves it."""
    routes = two_sessions()
    routes.route(binding_request(), PUBLISHER_A)
    assert routes.route(request_of_b(), PUBLISHER_A) == ("B", None)
    assert routes.owner_of(PUBLISHER_A) == "B"
    assert routes.addresses_of("A") == [] and routes.addresses_of("B") == [PUBLISHER_A]
    assert routes.route(SRTP, PUBLISHER_A) == ("B", None)
    assert routes.counters.addresses_rebound == 1
    assert routes.learned_addresses == 1


def test_nat_rebinding_learns_the_new_address_and_keeps_the_old_one() -> None:
    routes = two_sessions()
    old, new = PUBLISHER_A, (PUBLISHER_A[0], PUBLISHER_A[1] + 1)
    routes.route(binding_request(), old)
    assert routes.route(SRTP, new) == (None, DropReason.NOT_STUN)  # before its check
    assert routes.route(binding_request(), new) == ("A", None)
    assert routes.route(SRTP, new) == ("A", None)
    assert routes.route(SRTP, old) == ("A", None)  # in-flight media on the old path
    assert routes.addresses_of("A") == [new, old]  # least recently used first


# -- unregister, restart ----------------------------------------------------------------


def test_unregister_removes_credentials_and_every_learned_address() -> None:
    routes = two_sessions()
    a_addresses = [PUBLISHER_A, port(1), port(2)]
    for addr in a_addresses:
        routes.route(binding_request(), addr)
    routes.route(request_of_b(), PUBLISHER_B)
    assert routes.unregister("A") is True
    assert "A" not in routes and len(routes) == 1
    for addr in a_addresses:
        assert routes.owner_of(addr) is None
        assert routes.route(SRTP, addr) == (None, DropReason.NOT_STUN)
    assert routes.route(binding_request(), PUBLISHER_A) == (None, DropReason.UNKNOWN_UFRAG)
    assert routes.route(SRTP, PUBLISHER_B) == ("B", None)  # the other session is untouched
    assert routes.learned_addresses == 1
    assert routes.unregister("A") is False  # idempotent
    routes.register("A2", A_UFRAG, A_PWD, A_REMOTE)  # its ufrag is free again
    assert routes.route(binding_request(), PUBLISHER_A) == ("A2", None)


def test_ice_restart_old_ufrag_stops_matching_learned_addresses_stay() -> None:
    routes = two_sessions()
    routes.route(binding_request(), PUBLISHER_A)
    routes.register("A", "srvA2", "new-password-of-a-22ch", "pubA2")
    assert routes.route(SRTP, PUBLISHER_A) == ("A", None)
    assert routes.route(binding_request(), port(1)) == (None, DropReason.UNKNOWN_UFRAG)
    assert routes.route(binding_request(), PUBLISHER_A) == (None, DropReason.UNKNOWN_UFRAG)
    restarted = binding_request("srvA2:pubA2", "new-password-of-a-22ch")
    assert routes.route(restarted, port(1)) == ("A", None)
    assert routes.route(restarted, PUBLISHER_A) == ("A", None)
    assert routes.addresses_of("A") == [port(1), PUBLISHER_A]
    assert routes.route(binding_request("srvA2:pubA"), port(2)) == (
        None,
        DropReason.WRONG_REMOTE_UFRAG,
    )
    routes.register("A", "srvA2", "new-password-of-a-22ch", "pubA2")  # the same again: fine


def test_a_ufrag_names_one_session_and_credentials_are_checked() -> None:
    routes = two_sessions()
    with pytest.raises(UfragInUse):
        routes.register("C", A_UFRAG, "whatever-password")
    with pytest.raises(UfragInUse):
        routes.register("B", A_UFRAG, B_PWD)  # a restart onto A's ufrag
    assert routes.route(request_of_b(), PUBLISHER_B) == ("B", None)  # B is unchanged
    for ufrag, password, remote in (("", "p", None), ("a:b", "p", None), ("u", "", None)):
        with pytest.raises(ValueError):
            routes.register("C", ufrag, password, remote)
    with pytest.raises(ValueError):
        routes.register("C", "u", "p", "")
    with pytest.raises(ValueError):
        UdpMuxRoutes(max_addresses=0)
    assert "C" not in routes


# -- bounds -------------------------------------------------------------------------------


def test_the_per_session_cap_evicts_that_sessions_least_recently_used_address() -> None:
    routes = two_sessions(max_addresses_per_session=3)
    for n in (1, 2, 3):
        routes.route(binding_request(), port(n))
    routes.route(SRTP, port(1))  # port 1 carries media: now the most recently used
    routes.route(binding_request(), port(4))
    assert routes.addresses_of("A") == [port(3), port(1), port(4)]
    assert routes.owner_of(port(2)) is None
    assert routes.route(SRTP, port(2)) == (None, DropReason.NOT_STUN)
    assert routes.counters.evicted_session_cap == 1


def test_the_total_cap_evicts_the_least_recently_used_address_of_anyone() -> None:
    routes = two_sessions(max_addresses=3, max_addresses_per_session=3)
    routes.route(request_of_b(), PUBLISHER_B)
    routes.route(binding_request(), port(1))
    routes.route(binding_request(), port(2))
    routes.route(SRTP, PUBLISHER_B)  # B's media keeps B's address fresh
    routes.route(binding_request(), port(3))  # full: A's port 1 is the oldest
    assert routes.owner_of(port(1)) is None
    assert routes.addresses_of("A") == [port(2), port(3)]
    assert routes.addresses_of("B") == [PUBLISHER_B]
    assert routes.learned_addresses == 3
    assert routes.counters.evicted_table_cap == 1


def test_a_storm_of_verified_requests_from_many_ports_stays_bounded() -> None:
    """Only a holder of A's password can make these; they cost A its own idle
    addresses, never B's live one."""
    routes = two_sessions(max_addresses=64, max_addresses_per_session=8)
    routes.route(request_of_b(), PUBLISHER_B)
    request = binding_request()
    for n in range(5000):
        assert routes.route(request, port(n)) == ("A", None)
        if n % 100 == 0:
            assert routes.route(SRTP, PUBLISHER_B) == ("B", None)
    assert len(routes.addresses_of("A")) == 8
    assert routes.addresses_of("A")[-1] == port(4999)
    assert routes.learned_addresses == 9
    assert routes.owner_of(PUBLISHER_B) == "B"
    assert routes.counters.evicted_session_cap == 5000 - 8


# -- hostile bytes ------------------------------------------------------------------------


@settings(max_examples=500)
@given(st.binary(max_size=1600))
def test_random_bytes_from_an_unknown_address_never_raise_and_are_never_routed(
    data: bytes,
) -> None:
    routes = two_sessions()
    handle, reason = routes.route(data, STRANGER)
    assert handle is None and isinstance(reason, DropReason)
    assert routes.learned_addresses == 0


@settings(max_examples=500)
@given(st.binary(min_size=16, max_size=200))
def test_random_attributes_behind_a_valid_header_never_raise_and_are_never_routed(
    body: bytes,
) -> None:
    body = body[: len(body) - len(body) % 4]
    header = b"\x00\x01" + struct.pack("!H", len(body)) + b"\x21\x12\xa4\x42" + bytes(12)
    routes = two_sessions()
    handle, reason = routes.route(header + body, STRANGER)
    assert handle is None and isinstance(reason, DropReason)


SIGNED = binding_request()
COVERED = len(SIGNED) - 8  # through the MESSAGE-INTEGRITY value, before FINGERPRINT


@settings(max_examples=500)
@given(st.integers(min_value=0, max_value=COVERED - 1), st.integers(min_value=1, max_value=255))
def test_a_verified_request_changed_in_any_authenticated_byte_is_dropped(
    index: int, flip: int
) -> None:
    data = bytearray(SIGNED)
    data[index] ^= flip
    routes = two_sessions()
    handle, reason = routes.route(bytes(data), STRANGER)
    assert handle is None and reason is not None
    assert routes.learned_addresses == 0


def test_every_truncation_of_a_verified_request_is_dropped() -> None:
    routes = two_sessions()
    for cut in range(len(SIGNED)):
        handle, reason = routes.route(SIGNED[:cut], STRANGER)
        assert handle is None and reason in (DropReason.NOT_STUN, DropReason.MALFORMED)
    assert routes.learned_addresses == 0
    assert routes.route(SIGNED, STRANGER) == ("A", None)


def test_the_reader_says_what_a_datagram_is() -> None:
    assert read_binding_request(SRTP) is StunFault.NOT_STUN
    request = read_binding_request(SIGNED)
    assert isinstance(request, BindingRequest) and request.has_fingerprint
    assert request.integrity_matches(A_PWD.encode())
    assert not request.integrity_matches(B_PWD.encode())
    unsigned = read_binding_request(binding_request(password=None))
    assert isinstance(unsigned, BindingRequest) and not unsigned.integrity_matches(b"x")


# -- a real publisher's check ---------------------------------------------------------------


@pytest.fixture
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """aioice gathers on 127.0.0.1 only for this test (restored afterwards)."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)
    restrict_host_addresses(["127.0.0.1"])
    yield


def _ice_connection(transport: Any) -> Any:
    """The aioice ``Connection`` under an aiortc DTLS transport."""
    return transport.transport._connection


async def test_a_real_aiortc_publishers_binding_request_is_verified(loopback_ice: None) -> None:
    """The first Binding request an aiortc publisher sends, as the server's socket
    receives it (bytes and source address), routes to the server's session; with
    another password it does not."""
    publisher, server = new_peer_connection(), new_peer_connection()
    received: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue()
    try:
        publisher.addTransceiver("video", direction="sendonly")
        await publisher.setLocalDescription(await publisher.createOffer())
        await server.setRemoteDescription(publisher.localDescription)
        await server.setLocalDescription(await server.createAnswer())
        server_ice = _ice_connection(server.getTransceivers()[0].receiver.transport)
        publisher_ice = _ice_connection(publisher.getTransceivers()[0].sender.transport)
        for protocol in server_ice._protocols:
            deliver = protocol.datagram_received

            def record(data: bytes, addr: tuple[Any, ...], deliver: Any = deliver) -> None:
                received.put_nowait((bytes(data), (addr[0], addr[1])))
                deliver(data, addr)

            protocol.datagram_received = record
        await publisher.setRemoteDescription(server.localDescription)  # ICE starts
        while True:
            data, addr = await asyncio.wait_for(received.get(), 10)
            if data.startswith(b"\x00\x01"):
                break

        routes: UdpMuxRoutes[Any] = UdpMuxRoutes()
        routes.register(
            server_ice,
            server_ice.local_username,
            server_ice.local_password,
            publisher_ice.local_username,
        )
        assert routes.route(data, addr) == (server_ice, None)
        assert routes.owner_of(addr) is server_ice
        assert routes.route(SRTP, addr) == (server_ice, None)

        impostor: UdpMuxRoutes[Any] = UdpMuxRoutes()
        impostor.register("x", server_ice.local_username, "another-password-22chars")
        assert impostor.route(data, addr) == (None, DropReason.BAD_INTEGRITY)
    finally:
        await publisher.close()
        await server.close()
