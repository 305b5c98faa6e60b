"""The log a webhook dispatcher follows: the server's timeline, or the delivery process's
view of the same WAL.

Rules:

- :class:`DeliveredLog` is all a dispatcher (:mod:`whip.webhooks.dispatcher`) and its group
  (:class:`whip.webhooks.service.WebhookGroup`) read: the durable seq, the runs past a
  seq, one run's events after a seq, and the feed of durable batches. The server's
  :class:`registry.timeline.Timeline` is one (the dispatchers run in the server's process:
  tests, tools); :class:`FollowedLog` is the other.
- :class:`FollowedLog` is the log as the delivery process sees it
  (:mod:`whip.webhooks.delivery_process`): a :class:`registry.log_follower.LogFollower`
  over the WAL's segment files, advanced by :meth:`FollowedLog.advance` to the durable seq
  the server sends. Each advance indexes the new records, then publishes their runs on
  :attr:`FollowedLog.feed`, so a run taken from the feed is readable up to its seq, as the
  timeline's feed promises.
- Warm reads: the follower decodes each new event once, into its run's warm tail
  (:mod:`registry.log_follower`), so every dispatcher's read of it, the settle-without-a-
  task step's included (:meth:`FollowedLog.read_warm`), gets the same object without a
  file read; older events are read from the file (pages in the page cache, mostly).
- Loop-only: one event loop (the delivery process's) calls every method.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from registry.events import Event
from registry.feed import BatchFeed
from registry.log_follower import LogFollower


class DeliveredLog(Protocol):
    """What the webhook dispatchers read (module rules)."""

    @property
    def feed(self) -> BatchFeed: ...

    @property
    def durable_seq(self) -> int: ...

    def runs_after(self, seq: int) -> set[str]: ...

    def read_warm(self, run_id: str, after_seq: int, limit: int) -> list[Event] | None: ...

    async def read_events(
        self, run_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]: ...


class FollowedLog:
    """The WAL in ``wal_dir`` as far as the server said it is durable (module rules)."""

    def __init__(self, wal_dir: Path, max_record_bytes: int) -> None:
        self._follower = LogFollower(wal_dir, max_record_bytes)
        self._feed = BatchFeed()

    @property
    def feed(self) -> BatchFeed:
        return self._feed

    @property
    def durable_seq(self) -> int:
        return self._follower.last_seq

    async def start(self, upto: int) -> None:
        """Index the log up to ``upto`` before anything reads it (a whole log at start:
        in a thread). Cancellation: the thread finishes its scan; nothing reads it."""
        await asyncio.to_thread(self._follower.catch_up, upto, warm=False)

    def advance(self, upto: int) -> None:
        """Index up to ``upto`` (the server's durable seq), then name the runs on the
        feed. Raises :class:`registry.log_follower.LogFollowError`."""
        if upto <= self._follower.last_seq:
            return
        touched = self._follower.catch_up(upto)
        self._feed.publish(touched, self._follower.last_seq)

    def runs_after(self, seq: int) -> set[str]:
        return self._follower.runs_after(seq)

    def forget_passed(self, upto: int, idle_before_ms: int) -> int:
        """:meth:`registry.log_follower.LogFollower.forget_passed`."""
        return self._follower.forget_passed(upto, idle_before_ms)

    def read_warm(self, run_id: str, after_seq: int, limit: int) -> list[Event] | None:
        return self._follower.read(run_id, after_seq, limit)

    async def read_events(self, run_id: str, after_seq: int = 0, limit: int = 100) -> list[Event]:
        return self._follower.read(run_id, after_seq, limit)

    def close(self) -> list[OSError]:
        """Release the files (the errors, not raised)."""
        return self._follower.close()
