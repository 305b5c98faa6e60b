"""Frame processors for the end-to-end media tests, loaded through configuration
(``pipeline.processors = ["tests.support.media_processors:Blocker"]``).

They are controlled through module-level events (one test at a time uses them; the
``controls`` fixture of ``tests/test_whip_media.py`` resets them). Every wait is bounded,
so a forgotten release cannot hold the test process forever.
"""

from __future__ import annotations

import threading

import av

from pipeline.decoder import FrameMeta

MAX_BLOCK_S = 60.0
"""A safety net: no processor here waits longer than this for its release event (the
tests release them sooner; the back-pressure test holds its :class:`Blocker` for 20 s)."""

block_release = threading.Event()
"""Set to let :class:`Blocker` continue."""
blocked = threading.Event()
"""Set by :class:`Blocker` when it starts blocking."""
hang_release = threading.Event()
"""Set (at teardown) to let :class:`Hanger` threads end."""
hanging = threading.Event()
"""Set by :class:`Hanger` when it starts hanging."""
raised = threading.Event()


def reset() -> None:
    for event in (block_release, blocked, hang_release, hanging, raised):
        event.clear()
    Hanger.instances = 0
    Blocker.history = []


class Blocker:
    """Blocks the video worker at its 10th decoded frame until ``block_release``.

    ``Blocker.history`` records ``(rtp_timestamp, keyframe)`` of every frame it is
    given (all sessions' instances append to it; one session at a time in these tests),
    so a test can see where decoding picked up after the block."""

    kinds = ("video",)
    at_frame = 10
    history: list[tuple[int, bool]] = []  # noqa: RUF012 (reset() rebinds it per test)

    def __init__(self) -> None:
        self.seen = 0

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[tuple[str, dict[str, object]]]:
        self.seen += 1
        Blocker.history.append((meta.timestamp, meta.keyframe))
        if self.seen == self.at_frame:
            blocked.set()
            block_release.wait(MAX_BLOCK_S)
        return []


class Raiser:
    """Raises at the 5th decoded video frame (a processor bug)."""

    kinds = ("video",)

    def __init__(self) -> None:
        self.seen = 0

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[tuple[str, dict[str, object]]]:
        self.seen += 1
        if self.seen == 5:
            raised.set()
            raise RuntimeError("media_processors.Raiser: boom")
        return []


class Hanger:
    """The first session's instance hangs at its 5th video frame until ``hang_release``
    (bounded by ``MAX_BLOCK_S``); later sessions' instances pass frames through."""

    kinds = ("video",)
    instances = 0

    def __init__(self) -> None:
        Hanger.instances += 1
        self.armed = Hanger.instances == 1
        self.seen = 0

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[tuple[str, dict[str, object]]]:
        self.seen += 1
        if self.armed and self.seen == 5:
            hanging.set()
            hang_release.wait(MAX_BLOCK_S)
        return []


class LateBlocker(Blocker):
    """A :class:`Blocker` that holds at the 40th decoded video frame: the frames the
    sender keeps sending meanwhile pile up in the intake until the test releases it."""

    at_frame = 40


HOSTILE_TEXT = "<img src=x onerror=alert(1)>"
"""Markup a page must show as text (the dashboard test's hostile string)."""


class HostileLabel:
    """Emits one ``label`` event at the 3rd decoded video frame whose data is markup, as
    a processor that reads text from the picture (a caption, a QR code) could: the
    dashboard must show it as text. No state shared between sessions."""

    kinds = ("video",)

    def __init__(self) -> None:
        self.seen = 0

    def process(self, frame: av.VideoFrame, meta: FrameMeta) -> list[tuple[str, dict[str, object]]]:
        self.seen += 1
        if self.seen == 3:
            return [("label", {"text": HOSTILE_TEXT, HOSTILE_TEXT: "key"})]
        return []
