"""The one version and internals check of the aiortc adapter (:mod:`whip.rtc.compat`)."""

from __future__ import annotations

import pytest
from aiortc.rtcrtpreceiver import RTCRtpReceiver

from whip.rtc.compat import IncompatibleAiortcError, check_internals


def test_the_pinned_stack_passes_the_check() -> None:
    check_internals()


def test_a_moved_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_a_coroutine(self: RTCRtpReceiver, media_ssrc: int) -> None:
        return None

    monkeypatch.setattr(RTCRtpReceiver, "_send_rtcp_pli", not_a_coroutine)
    try:
        with pytest.raises(IncompatibleAiortcError, match="_send_rtcp_pli"):
            check_internals()
    finally:
        monkeypatch.undo()
    check_internals()
