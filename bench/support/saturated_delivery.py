"""``bench/webhooks.py --saturated S``: how late webhooks are delivered while busy loops
keep every core of the host busy, the delivery process's governor (SCHED_IDLE, back to
nice when starved: :mod:`whip.webhooks.child_priority`) against the child kept at nice.

For each mode (the governor moving a starved child in place where the kernel lets this
process, the governor always replacing it as an unprivileged server must, the child kept
at nice), in turn: a timeline of its own, 10 webhooks wanting every event, the delivery
process started, then ``2 x cores`` busy loops at this process's priority (each ends by
itself after the window plus a margin, and is killed after it) while 10 events a second are
appended for ``S`` seconds; then the loops end and every webhook's cursor is awaited. The
lag of an event is from its append's confirmation to the moment the smallest cursor the
child last pushed passed it (pushed at most every 50 ms, so a figure up to 50 ms late; a
starved child pushes late too, which is the point).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.events import NewEvent
from registry.timeline import Timeline, TimelineConfig
from whip.webhooks.config import WebhookConfig
from whip.webhooks.delivery_process import DeliveryProcess
from whip.webhooks.group import FEED_GATHER_S

BUSY = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
"""
RATE_PER_S = 10.0
WEBHOOKS = 10
DRAIN_S = 300.0


def busy_loops(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)]) for _ in range(count)]


def lag_figures(lags: list[float]) -> dict[str, float]:
    ordered = sorted(lags)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50_s": at(0.5), "p90_s": at(0.9), "max_s": round(ordered[-1], 3)}


async def one_mode(
    base: Path,
    url: str,
    make_webhook: Callable[[str, str], WebhookConfig],
    seconds: float,
    *,
    sched_idle: bool,
    in_place: bool = True,
) -> dict[str, Any]:
    name = ("idle" if in_place else "replaced") if sched_idle else "nice"
    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(base / f"saturated-{name}"))
    hooks = [make_webhook(f"sat-{name}-{n:02d}", url) for n in range(WEBHOOKS)]
    delivery = DeliveryProcess(
        hooks,
        timeline,
        base / f"saturated-{name}" / "webhooks",
        "uvloop",
        gather_s=FEED_GATHER_S,
        sched_idle=sched_idle,
        leave_idle_in_place=in_place,
    )
    appended: dict[int, float] = {}
    lags: list[float] = []
    passed = 0

    def take_passed() -> None:
        nonlocal passed
        items = delivery.items()
        cursors = [items.get(w.name, {}).get("cursor", 0) for w in delivery.webhooks]
        low = min(c if isinstance(c, int) else 0 for c in cursors)
        now = time.monotonic()
        for seq in sorted(s for s in appended if passed < s <= low):
            lags.append(now - appended.pop(seq))
        passed = max(passed, low)

    await delivery.start()
    first_pid = delivery.pid
    loops = busy_loops(2 * (os.cpu_count() or 2), seconds + 5)
    try:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            event = NewEvent(f"sat{n % 5}", "stream_warning", "bench", {"n": n})
            seq = await timeline.append(event)
            appended[seq] = time.monotonic()
            n += 1
            take_passed()
            await asyncio.sleep(max(0.0, start + n / RATE_PER_S - time.monotonic()))
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    deadline = time.monotonic() + DRAIN_S
    while appended and time.monotonic() < deadline:
        take_passed()
        await asyncio.sleep(0.01)
    result = {
        "sched_idle": sched_idle,
        "leave_idle_in_place": in_place,
        "events": n,
        "undelivered_after_drain": len(appended),
        "lag": lag_figures(lags) if lags else None,
        "starvations": delivery.governor.starvations,
        "replaced": delivery.pid != first_pid,
        "level_at_end": str(delivery.governor.level),
    }
    await delivery.aclose()
    await asyncio.to_thread(timeline.close)
    return result


async def saturated(
    base: Path, url: str, make_webhook: Callable[[str, str], WebhookConfig], seconds: float
) -> dict[str, Any]:
    """The governor (moving a starved child in place where the kernel lets this process,
    then always replacing it, as an unprivileged server must), then the child kept at
    nice (module rules)."""
    return {
        "seconds": seconds,
        "events_per_s": RATE_PER_S,
        "webhooks": WEBHOOKS,
        "busy_loops": 2 * (os.cpu_count() or 2),
        "governor": await one_mode(base, url, make_webhook, seconds, sched_idle=True),
        "governor_replacing": await one_mode(
            base, url, make_webhook, seconds, sched_idle=True, in_place=False
        ),
        "kept_at_nice": await one_mode(base, url, make_webhook, seconds, sched_idle=False),
    }
