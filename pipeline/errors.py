"""The pipeline's exception tree.

Every error here is a *local* fault (ours): none is caused by
what a publisher sent. Bad media from a publisher is never an exception: it is counted
(``dropped_frames``, ``decode_errors``) and the pipeline carries on. Each class carries
the HTTP status it would map to if it ever reached a request (always 500).
The one exception about bad media, :class:`pipeline.rtp_payload.errors.PayloadError`, is
outside this tree: aiortc's ``depayload`` contract needs a ``ValueError``; it is counted
where it is caught, never a fault.

- :class:`SupervisorStateError`: a :class:`pipeline.supervisor.Supervisor` was asked to do
  something its state does not allow (start twice, start after stop).
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error raised by the pipeline package."""

    http_status = 500
    code = "internal"


class SupervisorStateError(PipelineError):
    """A supervisor operation is not allowed in its current state."""
