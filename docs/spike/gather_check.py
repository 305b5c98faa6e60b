"""Which host candidates does aiortc put in a WHIP answer?  No traffic is sent:
only sockets are bound (iceServers=[] so no STUN lookup).

  python gather_check.py [--restrict]
"""
import asyncio, glob, os, sys, time
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spikelib

async def main():
    if "--restrict" in sys.argv:
        spikelib.restrict_host_addresses(["127.0.0.1"])
    offer = open(sorted(glob.glob("sdp/*.offer.sdp"))[0]).read()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    t0 = time.monotonic()
    await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
    await pc.setLocalDescription(await pc.createAnswer())
    ms = (time.monotonic() - t0) * 1000
    lines = [l for l in pc.localDescription.sdp.splitlines() if l.startswith(("a=candidate", "a=end-of", "c=", "m="))]
    print(f"restrict={'--restrict' in sys.argv} answer_ms={ms:.1f}")
    print("\n".join(lines))
    await pc.close()

asyncio.run(main())
