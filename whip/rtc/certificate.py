"""DTLS certificates whose context also offers ECDHE-RSA cipher suites.

aiortc's DTLS context offers only ECDHE-ECDSA suites; when we are the DTLS client, a
publisher with an RSA certificate finds no common suite. :func:`use_wide_certificate`
keeps the key and certificate aiortc generated for the peer connection and changes only
the class, so each session keeps its own DTLS identity.

aiortc internals touched: ``RTCPeerConnection.__certificates``,
``RTCCertificate._create_ssl_context``, ``RTCCertificate._key`` and ``._cert``.
"""

from __future__ import annotations

import inspect
from typing import Any

import aiortc
from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate

_ECDSA_SUITES = (
    b"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:"
    b"ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA"
)
_RSA_SUITES = (
    b"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:"
    b"ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA"
)


class WideCipherCertificate(RTCCertificate):
    """An ECDSA certificate whose DTLS context also offers ECDHE-RSA suites.

    Touches ``RTCCertificate._create_ssl_context``.
    """

    def _create_ssl_context(self, srtp_profiles: Any) -> Any:
        context = super()._create_ssl_context(srtp_profiles)
        context.set_cipher_list(_ECDSA_SUITES + b":" + _RSA_SUITES)
        return context


def use_wide_certificate(pc: RTCPeerConnection) -> None:
    """Make ``pc``'s certificate a :class:`WideCipherCertificate` (before any transceiver
    exists).

    The key and certificate are the ones aiortc generated for ``pc`` in its constructor
    (a fresh ECDSA P-256 pair per peer connection): only the class changes, so each
    session keeps its own DTLS identity and no second pair is generated.
    Touches ``RTCPeerConnection.__certificates``, ``RTCCertificate._key`` and ``._cert``.
    """
    own = pc._RTCPeerConnection__certificates  # type: ignore[attr-defined]
    pc._RTCPeerConnection__certificates = [  # type: ignore[attr-defined]
        WideCipherCertificate(key=cert._key, cert=cert._cert) for cert in own
    ]


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    if not callable(getattr(RTCCertificate, "_create_ssl_context", None)):
        problems.append("RTCCertificate._create_ssl_context")
    if "self.__certificates" not in inspect.getsource(aiortc.RTCPeerConnection.__init__):
        problems.append("RTCPeerConnection.__certificates")
    cert_src = inspect.getsource(RTCCertificate.__init__)
    if "self._key = key" not in cert_src or "self._cert = cert" not in cert_src:
        problems.append("RTCCertificate._key")
    return problems
