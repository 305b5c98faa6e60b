"""ICE-TCP's sans-IO core (whip/rtc/ice_tcp_sessions.py): what a first frame must be to bind a
connection to a session, and the passive candidates. Real aioice connections and real STUN
requests signed by aioice's own encoder; no sockets.
"""

from __future__ import annotations

import aioice
import aioice.candidate
import pytest

from tests.support.ice_tcp_client import binding_request
from whip.rtc.ice_tcp_sessions import (
    IceTcpSessions,
    TcpRefusal,
    UfragInUseError,
    passive_candidates,
)


def test_each_kind_of_first_frame_is_refused_for_its_own_reason() -> None:
    sessions = IceTcpSessions()
    connection = aioice.Connection(ice_controlling=False, local_username="srv1")
    key = connection.local_password.encode()
    sessions.register(connection, "s_1")
    signed = binding_request("srv1:pub", key)
    bad_fingerprint = signed[:-1] + bytes([signed[-1] ^ 1])
    response = bytearray(signed)
    response[0:2] = b"\x01\x01"
    cases = {
        b"": TcpRefusal.NOT_STUN,
        b"\x17\xfe\xfd" + bytes(40): TcpRefusal.NOT_STUN,
        bytes(response): TcpRefusal.NOT_BINDING_REQUEST,
        signed[:-4]: TcpRefusal.MALFORMED,
        bad_fingerprint: TcpRefusal.BAD_FINGERPRINT,
        bytes(1501): TcpRefusal.OVERSIZE_FRAME,
        binding_request(None, key): TcpRefusal.NO_USERNAME,
        binding_request("srv1", key): TcpRefusal.NO_USERNAME,
        binding_request("nobody:pub", key): TcpRefusal.UNKNOWN_UFRAG,
        binding_request("srv1:pub", None): TcpRefusal.NO_INTEGRITY,
        binding_request("srv1:pub", b"x" * 22): TcpRefusal.BAD_INTEGRITY,
    }
    assert {frame: sessions.verify(frame) for frame in cases} == cases
    assert sessions.verify(signed) is connection
    connection.remote_username = "pub"  # known once ICE starts: then checked too
    assert sessions.verify(signed) is connection
    assert sessions.verify(binding_request("srv1:other", key)) is TcpRefusal.WRONG_REMOTE_UFRAG


def test_only_the_current_credentials_of_a_registered_session_verify() -> None:
    sessions = IceTcpSessions()
    connection = aioice.Connection(ice_controlling=False, local_username="srv1")
    old_key = connection.local_password.encode()
    sessions.register(connection, "s_1")
    assert sessions.label_of(connection) == "s_1"

    # ICE restart: new credentials; until registered again nothing matches, then only them.
    connection._local_username, connection._local_password = "srv2", "p" * 22
    assert sessions.verify(binding_request("srv1:pub", old_key)) is TcpRefusal.UNKNOWN_UFRAG
    sessions.register(connection, "s_1")
    assert sessions.verify(binding_request("srv2:pub", b"p" * 22)) is connection
    assert sessions.verify(binding_request("srv1:pub", old_key)) is TcpRefusal.UNKNOWN_UFRAG

    other = aioice.Connection(ice_controlling=False, local_username="srv2")
    with pytest.raises(UfragInUseError):
        sessions.register(other, "s_2")
    assert sessions.unregister(connection) and not sessions.unregister(connection)
    assert sessions.verify(binding_request("srv2:pub", b"p" * 22)) is TcpRefusal.UNKNOWN_UFRAG
    assert len(sessions) == 0 and sessions.label_of(connection) is None
    sessions.register(other, "s_2")  # the ufrag is free again
    assert sessions.verify(binding_request("srv2:pub", other.local_password.encode())) is other


def test_passive_candidates_rank_below_udp_and_never_pair_on_their_own() -> None:
    candidates = passive_candidates(8189, ["127.0.0.1", "198.51.100.7", "127.0.0.1"], 1)
    assert [(c.host, c.port, c.transport, c.type, c.tcptype) for c in candidates] == [
        ("127.0.0.1", 8189, "tcp", "host", "passive"),
        ("198.51.100.7", 8189, "tcp", "host", "passive"),
    ]
    udp_host = aioice.candidate.candidate_priority(1, "host")
    assert all(c.priority < udp_host for c in candidates)
    assert candidates[0].priority > candidates[1].priority  # the address order
    assert candidates[0].priority >> 24 == 90  # RFC 6544 type preference
    assert (candidates[0].priority >> 8) & 0xFFFF == (4 << 13) | 8191  # direction passive
    remote = aioice.Candidate("f", 1, "tcp", 1, "127.0.0.1", 9, "host", tcptype="active")
    assert not candidates[0].can_pair_with(remote)
    assert "tcptype passive" in candidates[0].to_sdp()
