"""The one exception of the depacketizers: a malformed RTP payload or frame.

Rules:

- :class:`PayloadError` is a ``ValueError`` because aiortc drops a packet whose
  ``depayload`` raises ``ValueError`` (``RTCRtpReceiver._handle_rtp_packet``); nothing
  else may escape a depacketizer, whatever the bytes.
- It is a *remote* fault (the publisher sent it): it is counted, never logged per packet
  and never a session fault. ``reason`` is a short snake_case constant, fit for a metric
  label (a bounded set: every reason is a literal at its raise site); ``detail`` is for
  a debug log and may hold numbers from the packet.
"""

from __future__ import annotations


class PayloadError(ValueError):
    """A payload or frame the format's rules refuse; ``reason`` is the metric label."""

    http_status = 400
    code = "bad_media"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
