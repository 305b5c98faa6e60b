"""The recordings on disk: where segments go, what each run has, the disk budget.

Layout: ``<dir>/<run_id>/<index><ext>`` (``0.mp4``, ``1.mp4``... or ``.mkv``), one
directory per run, nothing else. A segment name is valid only as :data:`NAME_RE` says
(digits, a dot, ``mp4`` or ``mkv``): a name from a request is checked against it before
any path is built, and run ids are checked by the caller (the registry's id rule has no
``/``), so no request can name a path outside ``<dir>``.

Index: the store keeps, per run, its *complete* segments (name, bytes, duration, start),
added by the recorder when a segment closes (:meth:`RecordingStore.add`) and at start-up
from the disk and the timeline (:meth:`RecordingStore.scan`, :meth:`RecordingStore.add`).
A segment being written is not in the index until it is complete.

Budget (``max_bytes``, 0: none): after each segment is added, :meth:`RecordingStore.
enforce_budget` deletes whole runs' recordings, the oldest ended run first (the
caller's ``run_order`` says which runs are ended and how old), until the total fits. A
run that is still live is never evicted; when only live runs are left and the total is
still over, it answers False and the caller (the recorder) stops recording.

Threads and locks: recorder threads add and enforce, the event loop lists (and reads
sizes); every index access is under ``_lock``, a leaf. File deletion and scanning are
blocking I/O and happen on the calling thread without the lock held (the loop calls
:meth:`delete_run` and :meth:`scan` through ``asyncio.to_thread``).
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"(0|[1-9][0-9]{0,8})\.(mp4|mkv)")
"""A segment file name: its index (no leading zeros), then the container's extension."""

RunOrder = Callable[[str], tuple[bool, int] | None]
"""``run_order(run_id)`` -> ``(ended, created_ms)``, or None for a run the registry no
longer knows (treated as ended and oldest)."""


def segment_name(index: int, extension: str) -> str:
    """``<index><extension>`` (``3.mp4``)."""
    return f"{index}{extension}"


def segment_index(name: str) -> int | None:
    """The index of a valid segment name, else None."""
    match = NAME_RE.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """One complete segment as the REST list shows it."""

    name: str
    bytes: int
    duration_ms: int | None
    """None: not known (a file found on disk with no ``recording_segment`` yet)."""
    start_ms: int | None = None


class RecordingStore:
    """The recordings directory and its index (module doc)."""

    def __init__(self, root: Path, *, max_bytes: int = 0, run_order: RunOrder | None = None):
        self.root = root
        self.max_bytes = max_bytes
        self._run_order = run_order
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, SegmentEntry]] = {}
        self._total = 0
        self.evicted_runs = 0

    # ------------------------------------------------------------ paths

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def path(self, run_id: str, name: str) -> Path | None:
        """The file of a *valid* name (None otherwise; existence is not checked)."""
        if NAME_RE.fullmatch(name) is None:
            return None
        return self.run_dir(run_id) / name

    # ------------------------------------------------------------ index

    def add(self, run_id: str, entry: SegmentEntry) -> None:
        """Put ``entry`` in ``run_id``'s index (replacing one of the same name)."""
        with self._lock:
            segments = self._runs.setdefault(run_id, {})
            old = segments.get(entry.name)
            self._total += entry.bytes - (old.bytes if old is not None else 0)
            segments[entry.name] = entry

    def describe(self, run_id: str, name: str, duration_ms: int, start_ms: int | None) -> None:
        """Give a listed segment its duration (from its ``recording_segment`` event)."""
        with self._lock:
            segments = self._runs.get(run_id, {})
            entry = segments.get(name)
            if entry is not None:
                segments[name] = replace(entry, duration_ms=duration_ms, start_ms=start_ms)

    def segments(self, run_id: str) -> list[SegmentEntry]:
        """``run_id``'s complete segments, by index."""
        with self._lock:
            entries = list(self._runs.get(run_id, {}).values())
        return sorted(entries, key=lambda e: segment_index(e.name) or 0)

    def has(self, run_id: str, name: str) -> bool:
        with self._lock:
            return name in self._runs.get(run_id, {})

    def run_bytes(self, run_id: str) -> int:
        """Bytes of ``run_id``'s complete segments (0 when none)."""
        with self._lock:
            return sum(e.bytes for e in self._runs.get(run_id, {}).values())

    @property
    def total_bytes(self) -> int:
        return self._total

    def run_ids(self) -> list[str]:
        with self._lock:
            return list(self._runs)

    # ------------------------------------------------------------ disk (blocking)

    def scan(self) -> dict[str, list[str]]:
        """Index every valid segment file on disk (sizes only; durations come from the
        timeline). Blocking. Returns the names found per run. Anything that is not a
        segment name is left alone and logged."""
        found: dict[str, list[str]] = {}
        if not self.root.is_dir():
            return found
        for run_dir in sorted(self.root.iterdir()):
            if not run_dir.is_dir():
                continue
            for file in sorted(run_dir.iterdir()):
                if NAME_RE.fullmatch(file.name) is None or not file.is_file():
                    logger.warning("recordings: %s is not a segment; left alone", file)
                    continue
                self.add(run_dir.name, SegmentEntry(file.name, file.stat().st_size, None))
                found.setdefault(run_dir.name, []).append(file.name)
        return found

    def delete_run(self, run_id: str) -> int:
        """Delete every file of ``run_id`` and its directory; the bytes freed. Blocking."""
        with self._lock:
            segments = self._runs.pop(run_id, {})
            freed = sum(e.bytes for e in segments.values())
            self._total -= freed
        shutil.rmtree(self.run_dir(run_id), ignore_errors=True)
        logger.info("recordings: run %s deleted (%d bytes)", run_id, freed)
        return freed

    def delete_segment(self, run_id: str, name: str) -> None:
        """Forget one segment and delete its file if it is still there. Blocking."""
        with self._lock:
            entry = self._runs.get(run_id, {}).pop(name, None)
            if entry is not None:
                self._total -= entry.bytes
        path = self.path(run_id, name)
        if path is not None:
            path.unlink(missing_ok=True)

    def enforce_budget(self, live_run: str | None = None) -> bool:
        """Evict the oldest ended runs' recordings until the total fits the budget
        (module doc); True when it fits. ``live_run`` (the caller's own) is never
        evicted. Blocking (deletes files)."""
        if self.max_bytes <= 0:
            return True
        while self._total > self.max_bytes:
            victim = self._oldest_ended(live_run)
            if victim is None:
                logger.warning(
                    "recordings: %d bytes over the budget of %d and no ended run to evict",
                    self._total - self.max_bytes,
                    self.max_bytes,
                )
                return False
            self.delete_run(victim)
            self.evicted_runs += 1
            logger.info("recordings: run %s evicted by the disk budget", victim)
        return True

    def _oldest_ended(self, live_run: str | None) -> str | None:
        candidates: list[tuple[int, str]] = []
        for run_id in self.run_ids():
            if run_id == live_run:
                continue
            order = self._run_order(run_id) if self._run_order is not None else None
            if order is None:
                candidates.append((-1, run_id))
            elif order[0]:
                candidates.append((order[1], run_id))
        return min(candidates)[1] if candidates else None
