"""Spike helpers for whip-ingest: narrowly scoped, version-checked hooks into
aiortc 1.16.0 / aioice 0.13.0.  Written for the spike; every hook names the
private attribute it touches so production code can re-check it on upgrade.

Hooks:
  * restrict_host_addresses()  - ICE host candidates only on given addresses
  * install_media_consent()     - per-connection consent: authenticated inbound
                                  SRTP/SRTCP (or a consent response) is proof of
                                  life; no life for `timeout` s closes ICE
  * WideCipherCertificate       - RTCCertificate whose DTLS context also offers
                                  ECDHE-RSA suites (peers with RSA certificates)
  * EncodedFrameTap             - take JitterFrames from RTCRtpReceiver before
                                  aiortc's decoder thread; no decoder thread runs
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import aioice
import aioice.ice
import aiortc
import aiortc.rtcdtlstransport
from aioice import stun
from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate

log = logging.getLogger("spike")

TESTED_AIORTC = ("1.16.0",)
TESTED_AIOICE = ("0.13.0",)


def check_versions() -> None:
    if aiortc.__version__ not in TESTED_AIORTC or aioice.__version__ not in TESTED_AIOICE:
        raise RuntimeError(
            f"hooks verified against aiortc {TESTED_AIORTC} / aioice {TESTED_AIOICE}, "
            f"found aiortc {aiortc.__version__} / aioice {aioice.__version__}"
        )


# ---------------------------------------------------------------- 1. ICE hosts

def restrict_host_addresses(addresses: list[str]) -> None:
    """Process-wide: aioice gathers host candidates only on `addresses`.

    aioice.ice.get_host_addresses() enumerates all interfaces with ifaddr and
    explicitly *skips* 127.0.0.1 (ice.py:91-102).  Connection.gather_candidates
    looks the function up as a module global at call time (ice.py:581), so
    replacing the module attribute is enough.  Process-wide is fine for a
    server whose bind addresses are configuration, not per session.
    """
    check_versions()
    fixed = list(addresses)

    def _get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in fixed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = _get_host_addresses


# ---------------------------------------------------------- 2. media consent

@dataclass
class Liveness:
    timeout: float
    started: float = field(default_factory=time.monotonic)
    last_media: Optional[float] = None
    last_consent_ok: Optional[float] = None
    media_packets: int = 0
    consent_sent: int = 0
    consent_ok: int = 0
    expired_at: Optional[float] = None

    def last_life(self) -> float:
        return max(x for x in (self.started, self.last_media, self.last_consent_ok) if x is not None)


def install_media_consent(
    pc: RTCPeerConnection,
    timeout: float = 10.0,
    check_interval: float = 1.0,
    send_consent: bool = True,
    consent_interval: float = 5.0,
    on_expired: Optional[Callable[[Liveness], None]] = None,
) -> Liveness:
    """Replace aioice's RFC 7675 consent loop for this peer connection.

    Call after setRemoteDescription (the bundled transports exist then) and
    before ICE connects.  Liveness = time of the last authenticated inbound
    SRTP/SRTCP packet (hooked *after* SRTP unprotect, so spoofed datagrams do
    not count) or the last successful consent response.  When neither happens
    for `timeout` seconds the aioice Connection is closed, which aiortc turns
    into iceConnectionState/connectionState "failed" (rtcicetransport.py:368-374).

    Touches: aioice Connection.query_consent (instance attribute shadows the
    method started by connect(), ice.py:657), Connection._query_consent_task,
    Connection._nominated, RTCDtlsTransport._handle_rtp_data/_handle_rtcp_data
    (called only after a successful unprotect, rtcdtlstransport.py:669-675).
    """
    check_versions()
    state = Liveness(timeout=timeout)
    dtls_transports = {t.receiver.transport for t in pc.getTransceivers()}
    for dtls in dtls_transports:
        conn = dtls.transport._connection
        _hook_dtls_rx(dtls, state)
        conn.query_consent = _make_consent_loop(conn, state, check_interval, send_consent,
                                                consent_interval, on_expired)
    return state


def _hook_dtls_rx(dtls, state: Liveness) -> None:
    orig_rtp = dtls._handle_rtp_data
    orig_rtcp = dtls._handle_rtcp_data

    async def _handle_rtp_data(data: bytes, arrival_time_ms: int) -> None:
        state.last_media = time.monotonic()
        state.media_packets += 1
        await orig_rtp(data, arrival_time_ms)

    async def _handle_rtcp_data(data: bytes) -> None:
        state.last_media = time.monotonic()
        state.media_packets += 1
        await orig_rtcp(data)

    dtls._handle_rtp_data = _handle_rtp_data
    dtls._handle_rtcp_data = _handle_rtcp_data


def _make_consent_loop(conn, state, check_interval, send_consent, consent_interval, on_expired):
    async def _one_consent(pair) -> None:
        request = conn.build_request(pair, nominate=False)
        state.consent_sent += 1
        try:
            await pair.protocol.request(
                request, pair.remote_addr,
                integrity_key=conn.remote_password.encode("utf8"), retransmissions=0)
        except stun.TransactionError:
            return
        except Exception:  # socket closed under us
            return
        state.consent_ok += 1
        state.last_consent_ok = time.monotonic()

    async def query_consent() -> None:
        state.started = time.monotonic()
        next_consent = state.started + consent_interval
        pending: set[asyncio.Task] = set()
        try:
            while True:
                await asyncio.sleep(check_interval)
                now = time.monotonic()
                if send_consent and now >= next_consent:
                    next_consent = now + consent_interval
                    for pair in list(conn._nominated.values()):
                        t = asyncio.create_task(_one_consent(pair))
                        pending.add(t)
                        t.add_done_callback(pending.discard)
                if now - state.last_life() > state.timeout:
                    state.expired_at = now
                    log.info("%s no media/consent for %.1fs > %.1fs: closing", conn,
                             now - state.last_life(), state.timeout)
                    if on_expired:
                        on_expired(state)
                    conn._query_consent_task = None  # so close() does not cancel us
                    await conn.close()
                    return
        finally:
            for t in pending:
                t.cancel()

    return query_consent


# ------------------------------------------------------- 3. DTLS cipher list

STOCK_CIPHERS = (b"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:"
                 b"ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA")
WIDE_CIPHERS = STOCK_CIPHERS + (b":ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:"
                                b"ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-SHA:"
                                b"ECDHE-RSA-AES256-SHA")


class WideCipherCertificate(RTCCertificate):
    """RTCCertificate whose SSL context also offers ECDHE-RSA suites.

    Stock RTCCertificate._create_ssl_context (rtcdtlstransport.py:194-209)
    sets only ECDHE-ECDSA suites (line 204-206).  With DTLS 1.2 the suite's
    authentication algorithm is the *DTLS server's* certificate type, so when
    aiortc is the DTLS client (answer a=setup:active) a server with an RSA
    certificate finds no common suite.  Works with any key type for our own
    certificate (RTCCertificate.__init__ just stores key and cert).
    """

    cipher_list = WIDE_CIPHERS
    max_proto: Optional[int] = None  # e.g. 0xFEFD to pin DTLS 1.2 (tests)

    def _create_ssl_context(self, srtp_profiles):
        ctx = super()._create_ssl_context(srtp_profiles)
        ctx.set_cipher_list(self.cipher_list)
        if self.max_proto is not None:
            ctx.set_max_proto_version(self.max_proto)
        return ctx


def use_certificate(pc: RTCPeerConnection, cert: RTCCertificate) -> None:
    """Per-connection: replace the certificate generated in
    RTCPeerConnection.__init__ (rtcpeerconnection.py:295).  Must be called
    before any transceiver/transport exists (before setRemoteDescription /
    addTransceiver), since RTCDtlsTransport copies it at creation (line 1152)."""
    check_versions()
    pc._RTCPeerConnection__certificates = [cert]


def rsa_certificate(bits: int = 2048, cls=RTCCertificate) -> RTCCertificate:
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    cert = aiortc.rtcdtlstransport.generate_certificate(key)  # works for any key type
    return cls(key=key, cert=cert)


# ---------------------------------------------------- 4. encoded frame tap

H264_IDR = 5


def h264_is_keyframe(annexb: bytes) -> bool:
    """IDR NAL present (aiortc's depayloader emits Annex-B with 4-byte start codes)."""
    i = 0
    n = len(annexb)
    while True:
        i = annexb.find(b"\x00\x00\x01", i)
        if i < 0 or i + 3 >= n:
            return False
        if annexb[i + 3] & 0x1F == H264_IDR:
            return True
        i += 3


def vp8_is_keyframe(data: bytes) -> bool:
    # VP8 payload header (RFC 6386 9.1): P bit (bit 0 of byte 0) == 0 -> key frame
    return len(data) > 0 and (data[0] & 0x01) == 0


class _NoThread:
    """Stands in for RTCRtpReceiver.__decoder_thread: truthy, join() no-op."""

    name = "encoded-tap (no aiortc decoder thread)"

    def start(self) -> None:
        return None

    def join(self, timeout=None) -> None:
        return None

    def is_alive(self) -> bool:
        return False


class EncodedFrameTap:
    """Per-receiver hook: complete encoded frames go to `sink(codec, frame)`.

    aiortc path (rtcrtpreceiver.py):
      _handle_rtp_packet (471) -> depayload (543) -> JitterBuffer.add (551)
      -> JitterFrame(data, timestamp) -> timestamp mapped (564) ->
      self.__decoder_queue.put((codec, frame)) (567), only
      `if encoded_frame is not None and self.__decoder_thread`.
      receive() (392-420) starts decoder_worker on a threading.Thread.

    The tap wraps receiver.receive (instance attribute) so the stock body runs
    with module-level `threading` swapped for a shim whose Thread() returns a
    _NoThread; receive() has no await before the thread start, so the swap is
    never visible to another task.  __decoder_queue becomes an object whose
    put() calls the sink; __stop_decoder's put(None) becomes end-of-stream.
    The RemoteStreamTrack never gets frames (nobody should recv() it).
    """

    def __init__(self, receiver, sink: Callable[[object, Optional[object]], None]) -> None:
        check_versions()
        self.receiver = receiver
        self.sink = sink
        tap = self

        class _SinkQueue:
            def put(self, item, block=True, timeout=None):
                if item is None:
                    tap.sink(None, None)
                else:
                    codec, frame = item
                    tap.sink(codec, frame)

            def get(self, *a, **kw):  # never used: no thread reads it
                raise RuntimeError("EncodedFrameTap queue is write-only")

        receiver._RTCRtpReceiver__decoder_queue = _SinkQueue()
        orig_receive = receiver.receive

        async def receive(parameters):
            import aiortc.rtcrtpreceiver as rr
            real = rr.threading

            class _Shim:
                Event = real.Event

                @staticmethod
                def Thread(*a, **kw):
                    return _NoThread()

            rr.threading = _Shim
            try:
                coro = orig_receive(parameters)
                # drive the coroutine synchronously: it never suspends
                try:
                    coro.send(None)
                except StopIteration:
                    pass
                else:
                    raise RuntimeError("RTCRtpReceiver.receive suspended; hook invalid")
            finally:
                rr.threading = real

        receiver.receive = receive

    async def send_pli(self, media_ssrc: int) -> None:
        """RTCRtpReceiver._send_rtcp_pli (rtcrtpreceiver.py:630); needs the
        receiver's RTCP SSRC, set by the transceiver (_set_rtcp_ssrc, 640)."""
        await self.receiver._send_rtcp_pli(media_ssrc)

    def media_ssrcs(self) -> list[int]:
        return list(self.receiver._RTCRtpReceiver__remote_streams.keys())


class DecodeWorker:
    """Bounded queue + PyAV decode thread (what the pipeline would own)."""

    def __init__(self, kind: str, depth: int = 64, on_need_keyframe=None) -> None:
        self.kind = kind
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.frames_in = 0
        self.bytes_in = 0
        self.keyframes = 0
        self.dropped = 0
        self.decoded = 0
        self.decode_errors = 0
        self.first_in: Optional[float] = None
        self.first_decoded: Optional[float] = None
        self.last_shape = None
        self.codec_name = None
        self.waiting_key = False
        self.on_need_keyframe = on_need_keyframe
        self.thread = threading.Thread(target=self._run, name=f"spike-decode-{kind}", daemon=True)
        self.thread.start()

    def sink(self, codec, frame) -> None:  # event-loop thread
        if codec is None:
            self._put_stop()
            return
        now = time.monotonic()
        if self.first_in is None:
            self.first_in = now
        self.frames_in += 1
        self.bytes_in += len(frame.data)
        key = False
        if codec.name == "H264":
            key = h264_is_keyframe(frame.data)
        elif codec.name == "VP8":
            key = vp8_is_keyframe(frame.data)
        elif self.kind == "audio":
            key = True
        if key and self.kind == "video":
            self.keyframes += 1
        if self.waiting_key and not key:
            self.dropped += 1
            return
        self.waiting_key = False
        try:
            self.q.put_nowait((codec.name, frame.data, frame.timestamp))
        except queue.Full:
            self.dropped += 1
            if self.kind == "video":
                self.waiting_key = True
                if self.on_need_keyframe:
                    self.on_need_keyframe()

    def _put_stop(self) -> None:
        while True:
            try:
                self.q.put_nowait(None)
                return
            except queue.Full:
                try:
                    self.q.get_nowait()
                except queue.Empty:
                    pass

    def stop(self, timeout: float = 2.0) -> bool:
        self._put_stop()
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        import av
        ctx = None
        while True:
            item = self.q.get()
            if item is None:
                return
            name, data, ts = item
            if ctx is None:
                self.codec_name = name
                ctx = av.CodecContext.create({"H264": "h264", "VP8": "vp8", "opus": "opus"}.get(name, name.lower()), "r")
                if name == "opus":
                    ctx.sample_rate = 48000
                    ctx.layout = "stereo"
            try:
                pkt = av.Packet(data)
                pkt.pts = ts
                for f in ctx.decode(pkt):
                    self.decoded += 1
                    if self.first_decoded is None:
                        self.first_decoded = time.monotonic()
                    if self.kind == "video":
                        self.last_shape = (f.width, f.height, f.format.name)
                    else:
                        self.last_shape = (f.sample_rate, f.layout.name, f.samples)
            except av.FFmpegError:
                self.decode_errors += 1


# ------------------------------------------------ 1b. early DTLS resend

def install_dtls_kick(pc: RTCPeerConnection, delays_ms=(20, 60, 150, 300, 600),
                      on_kick: Optional[Callable[[int], None]] = None) -> None:
    """When aiortc is the DTLS *client* (answer a=setup:active, the only valid
    answer to FFmpeg's default a=setup:passive offer), its ClientHello is sent
    the instant aiortc's own ICE check succeeds, which can be before the peer
    reads DTLS (FFmpeg drops it), so the handshake waits out OpenSSL's 1 s
    initial retransmit timer (pyOpenSSL exposes no DTLS_set_timer_cb).

    This resends the *same* first-flight datagram at `delays_ms` after the
    first send while no datagram at all has come back through the DTLS
    transport.  A byte-identical duplicate is what a lost-then-retransmitted
    packet looks like to the peer, so it is harmless if the first one arrived.

    Touches: RTCIceTransport._send (instance attribute, rtcicetransport.py:278),
    RTCDtlsTransport._role, ._state and the name-mangled rx counter
    _RTCDtlsTransport__rx_packets (rtcdtlstransport.py:371, 647-648).
    """
    check_versions()
    from aiortc.rtcdtlstransport import State as DtlsState
    for dtls in {t.receiver.transport for t in pc.getTransceivers()}:
        ice = dtls.transport
        orig_send = ice._send
        st = {"first": None}

        async def kicker(data: bytes, dtls=dtls, orig_send=orig_send) -> None:
            t0 = time.monotonic()
            for d in delays_ms:  # bounded
                await asyncio.sleep(max(0.0, t0 + d / 1000 - time.monotonic()))
                if dtls._state != DtlsState.CONNECTING or dtls._RTCDtlsTransport__rx_packets:
                    return
                try:
                    await orig_send(data)
                except ConnectionError:
                    return
                if on_kick:
                    on_kick(d)

        async def send(data: bytes, dtls=dtls, orig_send=orig_send, st=st) -> None:
            await orig_send(data)
            if (st["first"] is None and dtls._role == "client" and data and 20 <= data[0] <= 63
                    and dtls._state == DtlsState.CONNECTING):
                st["first"] = asyncio.ensure_future(kicker(bytes(data)))

        ice._send = send
