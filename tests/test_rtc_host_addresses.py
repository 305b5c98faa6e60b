"""Host candidates (:mod:`whip.rtc.host_addresses`): exactly the configured addresses.

Pinned here, as the module docstring states them:

- after :func:`restrict_host_addresses`, a fresh peer connection gathers host candidates
  on exactly the given addresses (aioice on its own skips loopback: this machine would
  advertise only its other interfaces); IPv4 and IPv6 addresses follow aioice's
  ``use_ipv4``/``use_ipv6`` flags;
- an empty list is refused and leaves the lookup as it was;
- :func:`local_addresses` is every address of the machine, loopback included, whatever the
  restriction.

The restriction is process-wide (the servers' ``configure_ice`` sets it too, and the
suite's servers leave it at 127.0.0.1), so every test here puts aioice's lookup back as
it found it (``monkeypatch`` restores the attribute at teardown), and the gathering test
moves the restriction twice, so it cannot pass on a restriction made before it.

Checked to fail (then restored): with ``restrict_host_addresses`` not assigning the
lookup, the gathering test fails on its first address set; with the family filter
dropped, the family test fails; with ``fixed = addresses`` (an iterable kept as given),
the generator test fails; with the empty check removed, the refusal test fails; with
``local_addresses`` reading the installed lookup, the loopback test fails.
"""

from __future__ import annotations

import aioice.ice
import pytest

from whip.rtc.host_addresses import local_addresses, restrict_host_addresses
from whip.rtc.peer import close_quietly, new_peer_connection


@pytest.fixture(autouse=True)
def lookup_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """aioice's host address lookup is put back as it was, after each test."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)


async def host_candidates() -> list[tuple[str, str]]:
    """``(address, type)`` of every candidate a fresh peer connection gathers."""
    pc = new_peer_connection()
    try:
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        lines = [
            line.split()
            for line in pc.localDescription.sdp.splitlines()
            if line.startswith("a=candidate:")
        ]
    finally:
        await close_quietly(pc, "test")
    return [(fields[4], fields[7]) for fields in lines]


async def test_a_fresh_peer_gathers_only_on_the_given_addresses() -> None:
    restrict_host_addresses(["::1"])
    assert await host_candidates() == [("::1", "host")]
    restrict_host_addresses(["127.0.0.1"])
    assert await host_candidates() == [("127.0.0.1", "host")]


def test_addresses_follow_aioices_family_flags() -> None:
    restrict_host_addresses(["127.0.0.1", "::1"])
    lookup = aioice.ice.get_host_addresses
    assert lookup(use_ipv4=True, use_ipv6=True) == ["127.0.0.1", "::1"]
    assert lookup(use_ipv4=True, use_ipv6=False) == ["127.0.0.1"]
    assert lookup(use_ipv4=False, use_ipv6=True) == ["::1"]
    assert lookup(use_ipv4=False, use_ipv6=False) == []


def test_the_addresses_are_kept_not_the_iterable() -> None:
    restrict_host_addresses(address for address in ("127.0.0.1",))
    lookup = aioice.ice.get_host_addresses
    assert lookup(use_ipv4=True, use_ipv6=True) == ["127.0.0.1"]
    assert lookup(use_ipv4=True, use_ipv6=True) == ["127.0.0.1"], "every gathering asks again"


@pytest.mark.parametrize("empty", [[], ()], ids=["list", "tuple"])
def test_an_empty_list_is_refused_and_changes_nothing(empty: list[str]) -> None:
    before = aioice.ice.get_host_addresses
    with pytest.raises(ValueError, match="at least one host address"):
        restrict_host_addresses(empty)
    assert aioice.ice.get_host_addresses is before


def test_local_addresses_include_loopback_whatever_the_restriction() -> None:
    unrestricted = local_addresses()
    assert {"127.0.0.1", "::1"} <= unrestricted
    restrict_host_addresses(["127.0.0.1"])
    assert local_addresses() == unrestricted
