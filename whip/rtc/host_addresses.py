"""Host candidates: aioice gathers on every interface but skips 127.0.0.1.

A loopback-only or NAT'd server must advertise exactly its configured addresses
(``server.public_hosts``), so :func:`restrict_host_addresses` replaces aioice's address
lookup, process-wide (it is configuration, not per session).

aioice internals touched: ``aioice.ice.get_host_addresses`` (looked up at call time by
``Connection.gather_candidates``).
"""

from __future__ import annotations

from collections.abc import Iterable

import aioice.ice

_all_host_addresses = aioice.ice.get_host_addresses


def local_addresses() -> set[str]:
    """Every address of this machine's interfaces, loopback included."""
    return {*_all_host_addresses(use_ipv4=True, use_ipv6=True), "127.0.0.1", "::1"}


def restrict_host_addresses(addresses: Iterable[str]) -> None:
    """Make aioice gather host candidates on exactly ``addresses`` (process-wide).

    Touches ``aioice.ice.get_host_addresses`` (looked up at call time by
    ``Connection.gather_candidates``).
    """
    fixed = list(addresses)
    if not fixed:
        raise ValueError("at least one host address is needed")

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in fixed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    if callable(getattr(aioice.ice, "get_host_addresses", None)):
        return []
    return ["aioice.ice.get_host_addresses"]
