"""The aiortc adapter: every touch of aiortc, aioice and pylibsrtp internals lives here.

One module per patch, each naming the private attributes it touches and verifying them in
its ``internals_problems()``; :func:`whip.rtc.compat.check_internals` runs them all (with
the version check) from :func:`whip.app.create_app`. Nothing else in the project patches
aiortc; :mod:`pipeline` imports no aiortc at all.

- :mod:`whip.rtc.peer`: the one peer-connection factory (no ICE servers), quiet close.
- :mod:`whip.rtc.host_addresses`: advertise exactly the configured host addresses.
- :mod:`whip.rtc.rate_counter`: a compact receive-side bitrate counter (GC load).
- :mod:`whip.rtc.certificate`: DTLS contexts that also offer ECDHE-RSA suites.
- :mod:`whip.rtc.transceiver_codecs`: transceivers hold only the answered codecs.
- :mod:`whip.rtc.dtls_kick`: resend our first DTLS flight early as DTLS client.
- :mod:`whip.rtc.liveness`: media or a consent answer keeps a peer alive.
- :mod:`whip.rtc.tap`: encoded frames to our bounded intake, not aiortc's decoder.
- :mod:`whip.rtc.pli`: paced keyframe requests.
- :mod:`whip.rtc.rtp_guard`: hostile RTP refused or bounded, and counted.
- :mod:`whip.rtc.udp_mux_routes`: the one-port UDP mux's routing table (sans-IO), and
  :mod:`whip.rtc.stun`, its bounded Binding request reader.
- :mod:`whip.rtc.compat`: the tested versions and the one check.
"""
