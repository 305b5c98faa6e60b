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
- :mod:`whip.rtc.codec_table`: aiortc negotiates H.265, AV1, VP9 and every H.264 profile.
- :mod:`whip.rtc.depayload`: their RTP payloads depacketized in aiortc's receive path.
- :mod:`whip.rtc.dtls_kick`: resend our first DTLS flight early as DTLS client.
- :mod:`whip.rtc.liveness`: media or a consent answer keeps a peer alive.
- :mod:`whip.rtc.peer_end`: a clean end (DTLS close_notify, RTCP BYE) told apart.
- :mod:`whip.rtc.ice_restart`: ICE restart on a live aioice connection.
- :mod:`whip.rtc.tap`: encoded frames to our bounded intake, not aiortc's decoder.
- :mod:`whip.rtc.pli`: paced keyframe requests.
- :mod:`whip.rtc.sender_reports`: RTCP sender reports placed on a receiver's frame
  timeline (the recording's lip-sync).
- :mod:`whip.rtc.rtp_guard`: hostile RTP refused or bounded, and counted.
- :mod:`whip.rtc.congestion`: transport-wide feedback or REMB, and the bitrate ceiling;
  :mod:`whip.rtc.twcc`, its sans-IO feedback recorder and builder.
- :mod:`whip.rtc.udp_mux_routes`: the one-port UDP mux's routing table (sans-IO), and
  :mod:`whip.rtc.stun`, its bounded Binding request reader.
- :mod:`whip.rtc.ice_sockets`: the hook on aioice's socket creation for the server's
  connections; :mod:`whip.rtc.udp_mux`: the shared UDP port;
  :mod:`whip.rtc.session_sockets`: a socket per session within a port range;
  :mod:`whip.rtc.session_protocol`: the per-session STUN protocol of both (verified
  datagrams only, following a NAT rebinding).
- :mod:`whip.rtc.compat`: the tested versions and the one check.
"""
