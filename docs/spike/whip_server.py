"""Spike WHIP server (aiohttp + aiortc) on 127.0.0.1.

  python whip_server.py --port 8089 [--dtls-role auto|client|server]
         [--consent stock|media] [--media-timeout 10] [--mode track|tap]
         [--no-restrict] [--wide-ciphers] [--run-for 120]

Every line starting with "EVT " is a JSON event with ms since the POST.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
import uuid

from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spikelib  # noqa: E402

SESSIONS: dict[str, "Session"] = {}
ARGS: argparse.Namespace


def evt(sess: "Session | None", name: str, **data) -> None:
    rec = {"evt": name, "wall": round(time.time(), 3)}
    if sess is not None:
        rec["sid"] = sess.sid
        rec["ms"] = round((time.monotonic() - sess.t_post) * 1000, 1)
    rec.update(data)
    print("EVT " + json.dumps(rec), flush=True)


class Session:
    def __init__(self, sid: str, pc: RTCPeerConnection, t_post: float) -> None:
        self.sid = sid
        self.pc = pc
        self.t_post = t_post
        self.first_rtp = None
        self.rtp_packets = 0
        self.track_frames: dict[str, int] = {}
        self.first_frame: dict[str, float] = {}
        self.tasks: list[asyncio.Task] = []
        self.liveness = None
        self.workers: dict[str, spikelib.DecodeWorker] = {}
        self.taps: dict[str, spikelib.EncodedFrameTap] = {}
        self.closed = False

    def stats(self) -> dict:
        d = {
            "sid": self.sid,
            "connectionState": self.pc.connectionState,
            "iceConnectionState": self.pc.iceConnectionState,
            "rtp_packets": self.rtp_packets,
            "track_frames": self.track_frames,
            "threads": sorted(t.name for t in threading.enumerate()),
        }
        if self.liveness:
            lv = self.liveness
            d["liveness"] = {"media_packets": lv.media_packets, "consent_sent": lv.consent_sent,
                             "consent_ok": lv.consent_ok}
        for k, w in self.workers.items():
            d.setdefault("tap", {})[k] = {
                "codec": w.codec_name, "frames_in": w.frames_in, "bytes_in": w.bytes_in,
                "keyframes": w.keyframes, "decoded": w.decoded, "dropped": w.dropped,
                "decode_errors": w.decode_errors, "shape": w.last_shape}
        return d


DTLS_CT = {20: "CCS", 21: "alert", 22: "handshake", 23: "appdata"}
HS_T = {1: "ClientHello", 2: "ServerHello", 3: "HelloVerifyRequest", 11: "Certificate",
        12: "ServerKeyExchange", 13: "CertificateRequest", 14: "ServerHelloDone",
        15: "CertificateVerify", 16: "ClientKeyExchange", 20: "Finished"}


def describe(data: bytes) -> str:
    b = data[0]
    if 20 <= b <= 63:
        out = []
        i = 0
        while i + 13 <= len(data):  # walk DTLS records
            ct, epoch, ln = data[i], int.from_bytes(data[i+3:i+5], "big"), int.from_bytes(data[i+11:i+13], "big")
            name = DTLS_CT.get(ct, str(ct))
            if ct == 22 and epoch == 0 and i + 13 < len(data):
                name = HS_T.get(data[i+13], str(data[i+13]))
            elif epoch > 0:
                name += "(enc)"
            out.append(f"{name}/e{epoch}")
            i += 13 + ln
        return "DTLS " + ",".join(out) + f" {len(data)}B"
    if 128 <= b < 192:
        return f"SRTP/SRTCP {len(data)}B"
    return f"? {len(data)}B"


def trace_datagrams(sess: Session) -> None:
    for dtls in {t.receiver.transport for t in sess.pc.getTransceivers()}:
        ice = dtls.transport
        conn = ice._connection
        orig_rx = conn.data_received
        orig_tx = ice._send
        state = {"rx": 0, "tx": 0}

        def data_received(data, component, _o=orig_rx):
            if state["rx"] < 12 and not (128 <= data[0] < 192):
                state["rx"] += 1
                evt(sess, "rx", what=describe(data))
            _o(data, component)

        async def send(data, _o=orig_tx):
            if state["tx"] < 12 and not (128 <= data[0] < 192):
                state["tx"] += 1
                evt(sess, "tx", what=describe(data))
            await _o(data)

        conn.data_received = data_received
        ice._send = send


def hook_first_rtp(sess: Session) -> None:
    for dtls in {t.receiver.transport for t in sess.pc.getTransceivers()}:
        orig = dtls._handle_rtp_data

        async def _rtp(data, arrival_time_ms, _orig=orig):
            sess.rtp_packets += 1
            if sess.first_rtp is None:
                sess.first_rtp = time.monotonic()
                evt(sess, "first_rtp")
            await _orig(data, arrival_time_ms)

        dtls._handle_rtp_data = _rtp

        @dtls.on("statechange")
        def _dtls_state(d=dtls):
            evt(sess, "dtls_state", state=d.state, role=d._role,
                cipher=(d._ssl.get_cipher_name() if d._ssl and d.state == "connected" else None),
                version=(d._ssl.get_protocol_version_name() if d._ssl and d.state == "connected" else None))


async def consume_track(sess: Session, track) -> None:
    n = 0
    try:
        while True:  # bounded by the track's lifetime (MediaStreamError at end)
            frame = await track.recv()
            n += 1
            sess.track_frames[track.kind] = n
            if n == 1:
                sess.first_frame[track.kind] = time.monotonic()
                evt(sess, "first_frame", kind=track.kind, mode="track",
                    desc=(f"{frame.width}x{frame.height} {frame.format.name}" if track.kind == "video"
                          else f"{frame.sample_rate}Hz {frame.layout.name} {frame.samples}"))
    except MediaStreamError:
        pass
    evt(sess, "track_ended", kind=track.kind, frames=n)


async def close_session(sess: Session, reason: str) -> None:
    if sess.closed:
        return
    sess.closed = True
    evt(sess, "session_close", reason=reason, stats=sess.stats())
    await sess.pc.close()
    for w in sess.workers.values():
        ok = w.stop(2.0)
        evt(sess, "worker_joined", kind=w.kind, ok=ok, frames_in=w.frames_in, decoded=w.decoded)
    SESSIONS.pop(sess.sid, None)


async def whip_post(request: web.Request) -> web.Response:
    t_post = time.monotonic()
    if request.content_type != "application/sdp":
        return web.Response(status=415)
    offer = await request.text()
    sid = uuid.uuid4().hex[:12]
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if ARGS.wide_ciphers:
        spikelib.use_certificate(pc, spikelib.WideCipherCertificate.generateCertificate())
    sess = Session(sid, pc, t_post)
    SESSIONS[sid] = sess
    evt(sess, "post", offer_bytes=len(offer))
    if ARGS.dump_sdp:
        with open(os.path.join(ARGS.dump_sdp, f"{sid}.offer.sdp"), "w") as f:
            f.write(offer)

    @pc.on("connectionstatechange")
    async def _cs():
        evt(sess, "connection_state", state=pc.connectionState)
        if pc.connectionState in ("failed", "closed"):
            await close_session(sess, "peer_" + pc.connectionState)

    @pc.on("iceconnectionstatechange")
    def _ics():
        evt(sess, "ice_state", state=pc.iceConnectionState)

    if ARGS.mode == "track":
        @pc.on("track")
        def _track(track):
            sess.tasks.append(asyncio.ensure_future(consume_track(sess, track)))

    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    hook_first_rtp(sess)
    if ARGS.dtls_kick:
        spikelib.install_dtls_kick(pc, delays_ms=[int(x) for x in ARGS.dtls_kick.split(",")],
                                   on_kick=lambda d: evt(sess, "dtls_kick", at_ms=d))
    if ARGS.trace:
        trace_datagrams(sess)
    if ARGS.consent == "media":
        sess.liveness = spikelib.install_media_consent(
            pc, timeout=ARGS.media_timeout, check_interval=1.0,
            on_expired=lambda lv: evt(sess, "consent_expired", media_packets=lv.media_packets,
                                      consent_ok=lv.consent_ok))
    if ARGS.mode == "tap":
        for t in pc.getTransceivers():
            kind = t.kind
            tap_holder = {}

            def need_key(kind=kind, tap_holder=tap_holder):
                tap = tap_holder["tap"]
                for ssrc in tap.media_ssrcs():
                    asyncio.get_running_loop().create_task(tap.send_pli(ssrc))

            w = spikelib.DecodeWorker(kind, depth=ARGS.queue_depth, on_need_keyframe=need_key)

            def sink(codec, frame, w=w, kind=kind):
                first = w.frames_in == 0
                kf_before = w.keyframes
                w.sink(codec, frame)
                if codec is not None and w.keyframes != kf_before:
                    evt(sess, "keyframe", kind=kind, n=w.keyframes, bytes=len(frame.data), rtp_ts=frame.timestamp)
                if first and codec is not None and kind == "video" and ARGS.pli_at:
                    async def pli_later(tap_holder=tap_holder):
                        await asyncio.sleep(ARGS.pli_at)
                        tap = tap_holder["tap"]
                        ssrcs = tap.media_ssrcs()
                        for ssrc in ssrcs:
                            await tap.send_pli(ssrc)
                        evt(sess, "pli_sent", ssrcs=ssrcs)
                    sess.tasks.append(asyncio.ensure_future(pli_later()))
                if first and codec is not None:
                    sess.first_frame[kind] = time.monotonic()
                    evt(sess, "first_frame", kind=kind, mode="tap", codec=codec.name,
                        bytes=len(frame.data),
                        keyframe=(spikelib.h264_is_keyframe(frame.data) if codec.name == "H264" else None))

            tap = spikelib.EncodedFrameTap(t.receiver, sink)
            if kind == "video":
                dtls = t.receiver.transport
                orig_send_rtp = dtls._send_rtp

                async def _send_rtp(data, _o=orig_send_rtp):
                    # RTCP PSFB (PT 206) FMT 1 = PLI, logged before SRTCP protect
                    if len(data) > 1 and data[1] == 206 and data[0] & 0x1F == 1:
                        evt(sess, "rtcp_pli_on_wire", media_ssrc=int.from_bytes(data[8:12], "big"))
                    await _o(data)

                dtls._send_rtp = _send_rtp
            tap_holder["tap"] = tap
            sess.workers[kind] = w
            sess.taps[kind] = tap
    if ARGS.dtls_role != "auto":
        for t in pc.getTransceivers():
            t.receiver.transport._set_role(ARGS.dtls_role)
    answer = await pc.createAnswer()
    await pc.setLocalDescription(answer)
    sdp = pc.localDescription.sdp
    if ARGS.answer_filter == "strip-eoc":
        sdp = "".join(l + "\r\n" for l in sdp.splitlines() if l != "a=end-of-candidates")
    elif ARGS.answer_filter == "strip-candidates":
        sdp = "".join(l + "\r\n" for l in sdp.splitlines()
                      if not (l.startswith("a=candidate") or l == "a=end-of-candidates"))
    if ARGS.dump_sdp:
        with open(os.path.join(ARGS.dump_sdp, f"{sid}.answer.sdp"), "w") as f:
            f.write(sdp)
    cands = [line for line in sdp.splitlines() if line.startswith("a=candidate") or line == "a=end-of-candidates"]
    evt(sess, "answer_201", candidates=cands,
        setup=[line for line in sdp.splitlines() if line.startswith("a=setup")][:1])
    loc = f"/whip/sessions/{sid}"
    return web.Response(status=201, body=sdp.encode(), content_type="application/sdp",
                        headers={"Location": loc, "ETag": f'"{sid}"'})


async def whip_delete(request: web.Request) -> web.Response:
    sess = SESSIONS.get(request.match_info["sid"])
    if sess is None:
        return web.Response(status=404)
    evt(sess, "delete")
    await close_session(sess, "deleted")
    if ARGS.delete_reply == "204":
        return web.Response(status=204)
    if ARGS.delete_reply == "200-body":
        return web.Response(status=200, text="deleted\n", headers={"Connection": "close"})
    return web.Response(status=200)


async def whip_patch(request: web.Request) -> web.Response:
    return web.Response(status=405)


async def stats(request: web.Request) -> web.Response:
    return web.json_response({"sessions": [s.stats() for s in SESSIONS.values()],
                              "threads": sorted(t.name for t in threading.enumerate())})


async def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("--dtls-role", choices=["auto", "client", "server"], default="auto")
    ap.add_argument("--consent", choices=["stock", "media"], default="stock")
    ap.add_argument("--media-timeout", type=float, default=10.0)
    ap.add_argument("--mode", choices=["track", "tap"], default="track")
    ap.add_argument("--queue-depth", type=int, default=64)
    ap.add_argument("--no-restrict", action="store_true")
    ap.add_argument("--wide-ciphers", action="store_true")
    ap.add_argument("--dump-sdp", default=None)
    ap.add_argument("--run-for", type=float, default=300.0)
    ap.add_argument("--debug", default="")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--delete-reply", choices=["200", "204", "200-body"], default="200")
    ap.add_argument("--answer-filter", choices=["none", "strip-eoc", "strip-candidates"], default="none")
    ap.add_argument("--pli-at", type=float, default=0.0,
                    help="tap mode: send one PLI this many s after the first video frame")
    ap.add_argument("--dtls-kick", type=str, default="",
                    help="comma list of ms after the first ClientHello to resend it while nothing came back")
    ARGS = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("spike").setLevel(logging.INFO)
    for name in filter(None, ARGS.debug.split(",")):
        name, _, lvl = name.partition(":")
        logging.getLogger(name).setLevel(getattr(logging, lvl or "DEBUG"))
    if not ARGS.no_restrict:
        spikelib.restrict_host_addresses(["127.0.0.1"])
    app = web.Application()
    app.router.add_post("/whip", whip_post)
    app.router.add_delete("/whip/sessions/{sid}", whip_delete)
    app.router.add_patch("/whip/sessions/{sid}", whip_patch)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", ARGS.port)
    await site.start()
    evt(None, "listening", port=ARGS.port, pid=os.getpid(), args=vars(ARGS))
    try:
        await asyncio.sleep(ARGS.run_for)  # bounded lifetime
    finally:
        for s in list(SESSIONS.values()):
            await close_session(s, "shutdown")
        await runner.cleanup()
        evt(None, "exit")


if __name__ == "__main__":
    asyncio.run(main())
