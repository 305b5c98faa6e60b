"""The sender-report hook (:mod:`whip.rtc.sender_reports`): where a report's RTP
timestamp lands on the frames' timeline, across a 32-bit wrap, and its NTP time. The hook
on a live receiver is driven end to end by ``tests/test_recording_lipsync.py``."""

from __future__ import annotations

import pytest

from whip.rtc.rtp_timestamps import FrameTimestamps
from whip.rtc.sender_reports import internals_problems, ntp_seconds

NTP = 3_900_000_000.0


def test_the_hook_finds_what_it_relies_on() -> None:
    assert internals_problems() == []


def test_a_report_lands_on_the_frames_timeline_across_a_wrap() -> None:
    mapper = FrameTimestamps()
    assert mapper.place(5) is None  # before the first frame: nothing to tie it to
    first = (1 << 32) - 3000
    assert [mapper.map(t) for t in (first, first + 3000 - (1 << 32))] == [0, 3000]
    # A report after the wrap, one before it: placed, and the timeline's reference unmoved.
    assert mapper.place(6000) == 9000
    assert mapper.place(first - 1500) == -1500
    assert mapper.map(3000) == 6000
    assert ntp_seconds(int((NTP + 0.5) * (1 << 32))) == pytest.approx(NTP + 0.5)
