"""The pipeline's exception tree.

Every error here is a *local* fault (ours, or the installed aiortc's): none is caused by
what a publisher sent. Bad media from a publisher is never an exception: it is counted
(``dropped_frames``, ``decode_errors``) and the pipeline carries on. Each class carries
the HTTP status it would map to if it ever reached a request (always 500).

- :class:`IncompatibleAiortcError`: the aiortc internals the encoded-frame tap relies on
  moved (an upgrade); found at start-up by :func:`pipeline.intake.check_tap_internals`.
- :class:`TapNotInstalledError`: a tap was installed but did not take effect on one
  receiver (aiortc would have started its own decoder thread).
- :class:`RuntimeStateError`: a :class:`pipeline.runtime.SessionRuntime` was asked to do
  something its state does not allow (start twice, start after stop).
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error raised by the pipeline package."""

    http_status = 500
    code = "internal"


class IncompatibleAiortcError(PipelineError):
    """The installed aiortc differs from what the encoded-frame tap was verified against."""


class TapNotInstalledError(PipelineError):
    """The encoded-frame tap did not take effect on a receiver."""


class RuntimeStateError(PipelineError):
    """A session runtime operation is not allowed in its current state."""
