"""The one version and internals check of the aiortc adapter.

aiortc, aioice and pylibsrtp are pinned (``pyproject.toml``); every module of
:mod:`whip.rtc` that touches a private name of theirs has an ``internals_problems()``
that names what moved. :func:`check_internals` runs the version check and all of them;
:func:`whip.app.create_app` calls it, so a server on an upgraded stack refuses to start
with the list of what moved instead of failing in a session. The upgrade checklist is in
``docs/INTEROP.md``.
"""

from __future__ import annotations

import importlib.metadata

from whip.rtc import (
    arrival_stamps,
    certificate,
    codec_table,
    congestion,
    depayload,
    dtls_kick,
    host_addresses,
    ice_restart,
    ice_sockets,
    ice_tcp,
    ice_tcp_sessions,
    layer_path,
    liveness,
    peer_end,
    pli,
    rate_counter,
    rtp_guard,
    rtp_timestamps,
    sender_reports,
    session_protocol,
    session_sockets,
    simulcast,
    tap,
    transceiver_codecs,
    udp_mux,
)

TESTED_VERSIONS = {"aiortc": "1.16.0", "aioice": "0.13.0", "pylibsrtp": "1.0.0"}
"""The releases every hook was verified against (the pins in ``pyproject.toml``)."""

_CHECKS = (
    host_addresses,
    rate_counter,
    certificate,
    transceiver_codecs,
    codec_table,
    depayload,
    dtls_kick,
    liveness,
    peer_end,
    ice_restart,
    tap,
    pli,
    rtp_guard,
    ice_tcp_sessions,
    ice_tcp,
    congestion,
    arrival_stamps,
    ice_sockets,
    session_protocol,
    udp_mux,
    session_sockets,
    simulcast,
    layer_path,
    rtp_timestamps,
    sender_reports,
)


class IncompatibleAiortcError(RuntimeError):
    """The installed aiortc/aioice/pylibsrtp differ from what the adapter was verified
    against (a local fault: the server must not start)."""

    http_status = 500
    code = "internal"


def installed_versions() -> dict[str, str]:
    """The installed release of each pinned package."""
    return {name: importlib.metadata.version(name) for name in TESTED_VERSIONS}


def internals_problems() -> list[str]:
    """Every private name of aiortc/aioice/pylibsrtp the adapter relies on that moved."""
    problems: list[str] = []
    for module in _CHECKS:
        problems.extend(module.internals_problems())
    return problems


def check_internals() -> None:
    """Raise :class:`IncompatibleAiortcError` naming the versions that differ, or every
    internal that moved."""
    found = installed_versions()
    if found != TESTED_VERSIONS:
        raise IncompatibleAiortcError(
            "the aiortc adapter is verified against "
            + ", ".join(f"{k} {v}" for k, v in TESTED_VERSIONS.items())
            + "; found "
            + ", ".join(f"{k} {v}" for k, v in found.items())
        )
    problems = internals_problems()
    if problems:
        raise IncompatibleAiortcError(
            "aiortc/aioice/pylibsrtp internals the adapter relies on have changed: "
            + ", ".join(problems)
        )
