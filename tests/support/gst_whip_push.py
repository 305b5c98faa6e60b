"""A WHIP push from GStreamer's webrtcbin: run by the *system* Python (``/usr/bin/python3``
with PyGObject and the GStreamer 1.22 Debian packages), never imported by the tests.

Usage: ``gst_whip_push.py URL SECONDS CODEC [TOKEN]`` with CODEC ``h264`` (x264enc,
constrained baseline, ``rtph264pay``) or ``vp8`` (vp8enc, ``rtpvp8pay``); Opus audio
always. What webrtcbin itself decides is left to it, as a GStreamer WHIP client would:
its offer (``a=setup:actpass``, its own payload types and fmtp, bundle ``max-bundle``), its
ICE agent (libnice) and DTLS. The transceivers are made ``sendonly``. The offer is posted
after ICE gathering completes (no trickle), the answer applied, media sent for SECONDS,
then the session URL is DELETEd and the pipeline stopped.

Prints one JSON line on stdout: the POST and DELETE statuses, the ICE and peer connection
states reached (each with its seconds since the start), the offer and the answer, and
the RTP packets and bytes webrtcbin reports sent per SSRC. Exits 0 when the push ran to
its end, 1 on a refusal or a failure (with the reason in ``error``), and bounds itself:
every wait has a deadline.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

VIDEO = {
    "h264": (
        "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=30 bitrate=600"
        " ! video/x-h264,profile=constrained-baseline ! rtph264pay config-interval=-1"
        " aggregate-mode=zero-latency ! application/x-rtp,media=video,encoding-name=H264"
    ),
    "vp8": (
        "vp8enc deadline=1 keyframe-max-dist=30 target-bitrate=600000 ! rtpvp8pay"
        " ! application/x-rtp,media=video,encoding-name=VP8"
    ),
}
DEADLINE_S = 20.0
"""Bound on each wait: the offer, ICE gathering, the HTTP answers, the connection."""


class Push:
    def __init__(self, url: str, seconds: float, codec: str, token: str | None) -> None:
        self.url = url
        self.seconds = seconds
        self.token = token
        self.result: dict[str, object] = {"ice_states": [], "connection_states": []}
        self.loop = GLib.MainLoop()
        self.location: str | None = None
        self.posted = False
        self.started = GLib.get_monotonic_time() / 1e6
        """Monotonic seconds at start; each state is stamped with the seconds since."""
        self.pipeline = Gst.parse_launch(
            "webrtcbin name=send bundle-policy=max-bundle"
            " videotestsrc is-live=true pattern=smpte horizontal-speed=4"
            " ! video/x-raw,width=640,height=360,framerate=30/1 ! videoconvert ! queue"
            f" ! {VIDEO[codec]} ! queue ! send."
            " audiotestsrc is-live=true wave=sine ! audioconvert ! audioresample ! queue"
            " ! opusenc ! rtpopuspay ! application/x-rtp,media=audio,encoding-name=OPUS"
            " ! queue ! send."
        )
        self.webrtc = self.pipeline.get_by_name("send")
        self.webrtc.connect("on-negotiation-needed", self._on_negotiation_needed)
        self.webrtc.connect("notify::ice-gathering-state", self._on_gathering)
        self.webrtc.connect("notify::ice-connection-state", self._on_state, "ice")
        self.webrtc.connect("notify::connection-state", self._on_state, "connection")

    # ------------------------------------------------------------------ flow

    def run(self) -> int:
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self._on_error)
        self.pipeline.set_state(Gst.State.READY)
        for index in range(2):
            transceiver = self.webrtc.emit("get-transceiver", index)
            if transceiver is not None:
                transceiver.set_property(
                    "direction", GstWebRTC.WebRTCRTPTransceiverDirection.SENDONLY
                )
        self.pipeline.set_state(Gst.State.PLAYING)
        GLib.timeout_add(int(DEADLINE_S * 1000), self._connect_deadline)
        self.loop.run()
        self.pipeline.set_state(Gst.State.NULL)
        self._delete()
        print(json.dumps(self.result), flush=True)
        return 0 if "error" not in self.result else 1

    def fail(self, why: str) -> None:
        self.result.setdefault("error", why)
        self.loop.quit()

    def _on_error(self, _bus: Gst.Bus, message: Gst.Message) -> None:
        error, debug = message.parse_error()
        self.fail(f"pipeline error: {error.message} ({debug})")

    def _connect_deadline(self) -> bool:
        if "connected_at" not in self.result:
            self.fail(f"not connected within {DEADLINE_S} s")
        return False

    def _on_negotiation_needed(self, element: Gst.Element) -> None:
        promise = Gst.Promise.new_with_change_func(self._on_offer, element, None)
        element.emit("create-offer", None, promise)

    def _on_offer(self, promise: Gst.Promise, element: Gst.Element, _data: object) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        if offer is None:
            GLib.idle_add(self.fail, "webrtcbin made no offer")
            return
        element.emit("set-local-description", offer, Gst.Promise.new())

    def _on_gathering(self, element: Gst.Element, _spec: object) -> None:
        state = element.get_property("ice-gathering-state")
        if state != GstWebRTC.WebRTCICEGatheringState.COMPLETE or self.posted:
            return
        self.posted = True
        self.result["posted_at"] = round(GLib.get_monotonic_time() / 1e6 - self.started, 3)
        offer = element.get_property("local-description").sdp.as_text()
        self.result["offer"] = offer
        threading.Thread(target=self._post, args=(offer,), daemon=True).start()

    def _on_state(self, element: Gst.Element, _spec: object, which: str) -> None:
        prop = "ice-connection-state" if which == "ice" else "connection-state"
        name = element.get_property(prop).value_nick
        states = self.result[f"{which}_states"]
        assert isinstance(states, list)
        states.append([name, round(GLib.get_monotonic_time() / 1e6 - self.started, 3)])
        if which == "connection" and name == "connected" and "connected_at" not in self.result:
            self.result["connected_at"] = states[-1][1]
            GLib.timeout_add(int(self.seconds * 1000), self._finish)
        if which == "connection" and name == "failed":
            GLib.idle_add(self.fail, "peer connection failed")

    def _finish(self) -> bool:
        promise = Gst.Promise.new_with_change_func(self._on_stats, None, None)
        self.webrtc.emit("get-stats", None, promise)
        return False

    def _on_stats(self, promise: Gst.Promise, _a: object, _b: object) -> None:
        """RTP packets and bytes sent per SSRC (webrtcbin 1.22's ``outbound-rtp`` entries;
        their ``kind`` says ``audio`` for video too, so they are keyed by SSRC)."""
        sent: dict[str, dict[str, int]] = {}
        reply = promise.get_reply()
        for index in range(reply.n_fields() if reply is not None else 0):
            value = reply.get_value(reply.nth_field_name(index))
            if not isinstance(value, Gst.Structure) or value.get_name() != "outbound-rtp":
                continue
            _, ssrc = value.get_uint("ssrc")
            _, packets = value.get_uint64("packets-sent")
            _, octets = value.get_uint64("bytes-sent")
            sent[str(ssrc)] = {"packets": int(packets), "bytes": int(octets)}
        self.result["sent"] = sent
        GLib.idle_add(self.loop.quit)

    # ------------------------------------------------------------------ HTTP

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"User-Agent": f"GStreamer/{Gst.version_string()} webrtcbin"}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _post(self, offer: str) -> None:
        request = urllib.request.Request(
            self.url, offer.encode(), self._headers("application/sdp"), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=DEADLINE_S) as answer:
                self.result["post_status"] = answer.status
                location = answer.headers.get("Location")
                body = answer.read().decode()
        except urllib.error.HTTPError as error:
            self.result["post_status"] = error.code
            self.result["post_body"] = error.read().decode(errors="replace")[:2000]
            GLib.idle_add(self.fail, f"POST refused with {error.code}")
            return
        except OSError as error:
            GLib.idle_add(self.fail, f"POST failed: {error!r}")
            return
        self.location = urllib.parse.urljoin(self.url, location) if location else None
        self.result["answer"] = body
        GLib.idle_add(self._apply_answer, body)

    def _apply_answer(self, text: str) -> bool:
        status, message = GstSdp.SDPMessage.new_from_text(text)
        if status != GstSdp.SDPResult.OK:
            self.fail("the answer is not SDP that GStreamer parses")
            return False
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, message)
        self.webrtc.emit("set-remote-description", answer, Gst.Promise.new())
        return False

    def _delete(self) -> None:
        if self.location is None:
            return
        request = urllib.request.Request(
            self.location, headers=self._headers(None), method="DELETE"
        )
        try:
            with urllib.request.urlopen(request, timeout=DEADLINE_S) as answer:
                self.result["delete_status"] = answer.status
        except urllib.error.HTTPError as error:
            self.result["delete_status"] = error.code
        except OSError as error:
            self.result["delete_error"] = repr(error)


def main(argv: list[str]) -> int:
    Gst.init(None)
    url, seconds, codec = argv[1], float(argv[2]), argv[3]
    token = argv[4] if len(argv) > 4 else None
    if codec not in VIDEO:
        print(json.dumps({"error": f"codec {codec!r}: one of {sorted(VIDEO)}"}))
        return 2
    return Push(url, seconds, codec, token).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
