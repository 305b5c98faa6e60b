"""Paced keyframe requests (:mod:`whip.rtc.pli`); the PLI reaching a real sender is in
``tests/test_rtc_tap.py`` (the loopback publisher)."""

from __future__ import annotations

import asyncio

from whip.rtc.pli import PliPacer


async def test_keyframe_requests_are_paced_and_coalesced_never_dropped() -> None:
    """A burst of requests makes one PLI at once and one when the interval ends (not
    eleven, and not one: the later asks are folded, not lost); a request after a quiet
    interval goes out at once."""
    loop = asyncio.get_running_loop()
    sent_at: list[float] = []
    burst_sent = asyncio.Event()

    async def send() -> int:
        sent_at.append(loop.time())
        if len(sent_at) == 2:
            burst_sent.set()
        return 1

    pacer = PliPacer(send, loop, min_interval_s=0.2)
    for _ in range(11):
        pacer()
    await asyncio.sleep(0)  # the first one's task runs; the others wait
    assert len(sent_at) == 1
    await asyncio.wait_for(burst_sent.wait(), 5)
    assert (pacer.sent, pacer.coalesced) == (2, 10)
    assert sent_at[1] - sent_at[0] >= 0.19  # the pacing itself (a lower bound by design)
    await asyncio.sleep(0.25)  # a quiet interval
    pacer()
    await asyncio.sleep(0)  # the task runs
    assert len(sent_at) == 3 and pacer.sent == 3
