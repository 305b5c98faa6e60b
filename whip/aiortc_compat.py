"""The aiortc/aioice internals whip-ingest hooks, in one place, checked at start-up.

aiortc 1.16.0 and aioice 0.13.0 are pinned in pyproject.toml. Every hook below touches a
private attribute; :func:`check_internals` verifies each one exists with the shape we
rely on, and the server refuses to start (and ``tests/test_aiortc_compat.py`` fails
loudly) when an upgrade moves them. See ``docs/INTEROP.md`` for why each hook exists.
"""

from __future__ import annotations

import inspect

import aioice
import aioice.ice
import aiortc
import aiortc.rate
import aiortc.rtcdtlstransport
import aiortc.rtcicetransport
import aiortc.rtcpeerconnection
import aiortc.rtcrtpreceiver

TESTED_AIORTC = "1.16.0"
TESTED_AIOICE = "0.13.0"


class IncompatibleAiortcError(RuntimeError):
    """The installed aiortc/aioice differ from what the hooks were verified against."""


def check_internals() -> None:
    """Raise :class:`IncompatibleAiortcError` naming the first internal that moved."""
    if aiortc.__version__ != TESTED_AIORTC or aioice.__version__ != TESTED_AIOICE:
        raise IncompatibleAiortcError(
            f"hooks verified against aiortc {TESTED_AIORTC} / aioice {TESTED_AIOICE}, "
            f"found aiortc {aiortc.__version__} / aioice {aioice.__version__}"
        )
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    need(callable(getattr(aioice.ice, "get_host_addresses", None)), "aioice.ice.get_host_addresses")
    need(
        inspect.iscoroutinefunction(getattr(aioice.ice.Connection, "query_consent", None)),
        "aioice.ice.Connection.query_consent",
    )
    need(
        "_nominated" in inspect.getsource(aioice.ice.Connection.__init__),
        "aioice.ice.Connection._nominated",
    )
    cert = aiortc.rtcdtlstransport.RTCCertificate
    need(callable(getattr(cert, "_create_ssl_context", None)), "RTCCertificate._create_ssl_context")
    dtls = aiortc.rtcdtlstransport.RTCDtlsTransport
    for name in ("_handle_rtp_data", "_handle_rtcp_data"):
        need(inspect.iscoroutinefunction(getattr(dtls, name, None)), f"RTCDtlsTransport.{name}")
    need("__rx_packets" in inspect.getsource(dtls), "RTCDtlsTransport.__rx_packets")
    ice = aiortc.rtcicetransport.RTCIceTransport
    need(
        "self._send = self._connection.send" in inspect.getsource(ice.__init__),
        "RTCIceTransport._send",
    )
    pc_src = inspect.getsource(aiortc.RTCPeerConnection.__init__)
    need("self.__certificates" in pc_src, "RTCPeerConnection.__certificates")
    cert_src = inspect.getsource(cert.__init__)
    need("self._key = key" in cert_src and "self._cert = cert" in cert_src, "RTCCertificate._key")
    rate = aiortc.rate
    need(
        "RateCounter(1000, 8000)" in inspect.getsource(rate.RemoteBitrateEstimator.__init__),
        "aiortc.rate.RemoteBitrateEstimator.incoming_bitrate",
    )
    # aiortc's own class, also once whip.rtc_hooks.compact_rate_counters replaced it
    aiortc_counter = next(c for c in rate.RateCounter.__mro__ if c.__module__ == rate.__name__)
    counter_src = inspect.getsource(aiortc_counter)
    for name in ("_origin_index", "_origin_ms", "_scale", "_window_size"):
        need(f"self.{name} =" in counter_src, f"aiortc.rate.RateCounter.{name}")
    receiver = aiortc.rtcrtpreceiver.RTCRtpReceiver
    recv_src = inspect.getsource(receiver)
    for name in ("__decoder_queue", "__decoder_thread", "__remote_streams", "__started"):
        need(f"self.{name}" in recv_src, f"RTCRtpReceiver.{name}")
    need(
        inspect.iscoroutinefunction(getattr(receiver, "_send_rtcp_pli", None)),
        "RTCRtpReceiver._send_rtcp_pli",
    )
    transceiver = aiortc.RTCRtpTransceiver
    need("self._codecs" in inspect.getsource(transceiver), "RTCRtpTransceiver._codecs")
    need(
        callable(getattr(transceiver, "_get_mline_index", None)),
        "RTCRtpTransceiver._get_mline_index",
    )
    pc = inspect.getsource(aiortc.rtcpeerconnection)
    need(  # the one list behind the answer's m-line and the receive parameters
        "fmt=[c.payloadType for c in transceiver._codecs]" in pc
        and "codecs=transceiver._codecs," in pc,
        "RTCPeerConnection answers and receives transceiver._codecs",
    )
    if problems:
        raise IncompatibleAiortcError(
            "aiortc/aioice internals that whip-ingest hooks have changed: " + ", ".join(problems)
        )
