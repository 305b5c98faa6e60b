"""RTP depacketizers for the video formats aiortc lacks: H.265, AV1, VP9 (sans-IO, pure).

Rules:

- No I/O, no aiortc import (``pipeline/`` never imports it): the WebRTC adapter
  (``whip/rtc/``) feeds payloads in and frames out.
- Two steps per format, matching aiortc's receive path: a per-packet step
  (:meth:`~pipeline.rtp_payload.depacketizer.Depacketizer.depacketize`, stateless, whose
  outputs concatenate, as aiortc's jitter buffer joins ``packet._data`` of one RTP
  timestamp) and a frame step
  (:meth:`~pipeline.rtp_payload.depacketizer.Depacketizer.assemble`) that yields the
  decoder's bitstream. The per-packet output is an intermediate form
  (:mod:`pipeline.rtp_payload.fragments`), never fed to a decoder as is.
- Hostile input raises :class:`~pipeline.rtp_payload.errors.PayloadError` (a
  ``ValueError``, with a metric-label ``reason``) and nothing else; work is linear in the
  input and memory is bounded by the frame cap.
- One module per format: :mod:`~pipeline.rtp_payload.h265` (RFC 7798),
  :mod:`~pipeline.rtp_payload.av1` (AOM AV1 RTP v1.0), :mod:`~pipeline.rtp_payload.vp9`
  (RFC 9628); :func:`pipeline.rtp_payload.formats.depacketizer_for` picks one.
  Keyframe detection on the assembled bitstream is :mod:`pipeline.keyframes`.
"""
