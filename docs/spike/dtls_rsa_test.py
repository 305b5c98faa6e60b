"""Q3: DTLS between two aiortc peers over 127.0.0.1 where the *publisher*
has an RSA (or ECDSA) certificate; the ingest side is stock or patched
(WideCipherCertificate) and answers a=setup:active or a=setup:passive.

  python dtls_rsa_test.py            # full matrix, prints a table + JSON lines
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from aiortc import RTCConfiguration, RTCPeerConnection, VideoStreamTrack
from aiortc.rtcdtlstransport import RTCCertificate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spikelib  # noqa: E402

DTLS1_2 = 0xFEFD


def make_pub_cert(kind: str, pin12: bool) -> RTCCertificate:
    # The publisher simulates GStreamer / a hardware encoder: it can serve
    # ECDHE-RSA suites for its RSA key (else it could never be a DTLS server).
    cls = type("PubCert", (spikelib.WideCipherCertificate,), {"max_proto": DTLS1_2 if pin12 else None})
    if kind == "rsa":
        return spikelib.rsa_certificate(2048, cls=cls)
    return cls.generateCertificate()  # ECDSA P-256, like stock aiortc


async def one_case(pub_key: str, pin12: bool, server: str, answer_setup: str, timeout: float = 6.0) -> dict:
    pub = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    spikelib.use_certificate(pub, make_pub_cert(pub_key, pin12))
    ing = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if server == "patched":
        spikelib.use_certificate(ing, spikelib.WideCipherCertificate.generateCertificate())
    result: dict = {"pub_cert": pub_key, "pub_max": "DTLS1.2" if pin12 else "default",
                    "ingest": server, "answer_setup": answer_setup}
    got_frame = asyncio.get_running_loop().create_future()

    @ing.on("track")
    def on_track(track):
        async def rd():
            try:
                f = await track.recv()
                if not got_frame.done():
                    got_frame.set_result(f"{f.width}x{f.height}")
            except Exception as e:  # track ended
                if not got_frame.done():
                    got_frame.set_result(f"error {e!r}")
        asyncio.ensure_future(rd())

    done = asyncio.get_running_loop().create_future()

    def watch(pc, name):
        @pc.on("connectionstatechange")
        def _():
            if pc.connectionState in ("connected", "failed") and not done.done():
                done.set_result((name, pc.connectionState))

    watch(ing, "ingest")
    watch(pub, "publisher")
    t0 = time.monotonic()
    try:
        pub.addTransceiver(VideoStreamTrack(), direction="sendonly")
        await pub.setLocalDescription(await pub.createOffer())
        await ing.setRemoteDescription(pub.localDescription)
        for t in ing.getTransceivers():
            t.receiver.transport._set_role("client" if answer_setup == "active" else "server")
        await ing.setLocalDescription(await ing.createAnswer())
        assert f"a=setup:{answer_setup}" in ing.localDescription.sdp
        await pub.setRemoteDescription(ing.localDescription)
        try:
            await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            pass
        # let both sides settle
        await asyncio.sleep(0.2)
        result["ingest_state"] = ing.connectionState
        result["pub_state"] = pub.connectionState
        result["ms"] = round((time.monotonic() - t0) * 1000)
        dtls = next(iter({t.receiver.transport for t in ing.getTransceivers()}))
        result["ingest_dtls_role"] = dtls._role
        if dtls.state == "connected":
            result["cipher"] = dtls._ssl.get_cipher_name()
            result["version"] = dtls._ssl.get_protocol_version_name()
            peer = dtls._ssl.get_peer_certificate(as_cryptography=True)
            result["peer_key"] = type(peer.public_key()).__name__
            try:
                result["frame"] = await asyncio.wait_for(got_frame, 5)
            except asyncio.TimeoutError:
                result["frame"] = None
    finally:
        await pub.close()
        await ing.close()
    return result


async def main() -> None:
    spikelib.restrict_host_addresses(["127.0.0.1"])
    rows = []
    cases = []
    for pub_key, pin12 in (("rsa", True), ("rsa", False), ("ecdsa", True), ("ecdsa", False)):
        for server in ("stock", "patched"):
            for setup in ("active", "passive"):
                cases.append((pub_key, pin12, server, setup))
    for c in cases:  # bounded: 16 cases x <= ~12 s
        r = await one_case(*c)
        print("RES " + json.dumps(r), flush=True)
        rows.append(r)
    print()
    hdr = f"{'pub cert':8} {'pub max':8} {'ingest':8} {'answer':8} {'result':10} {'version':9} {'cipher':32} frame"
    print(hdr)
    for r in rows:
        print(f"{r['pub_cert']:8} {r['pub_max']:8} {r['ingest']:8} {r['answer_setup']:8} "
              f"{r['ingest_state']:10} {r.get('version', '-'):9} {r.get('cipher', '-'):32} {r.get('frame')}")


if __name__ == "__main__":
    asyncio.run(main())
