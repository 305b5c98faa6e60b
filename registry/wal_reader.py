"""Reads by position: durable events decoded from the segment files, from any thread.

Rules:

- Readers never use the writer's descriptor. Each segment gets one read-only
  descriptor, opened on first use and kept until :meth:`WalReader.close`; the lock
  that guards opening is a leaf, and an open descriptor is used without it
  (``os.pread`` has no shared file offset).
- A position (:class:`~registry.index.Position`) names a frame that is already
  durable: the writer indexes a batch only after its ``fdatasync``, so whatever a reader
  is given to read is on disk, whole.
- Adjacent frames of one segment are read with one ``pread``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from registry.events import Event
from registry.index import Position
from registry.record import ScanOutcome, decode_frame_at, scan_segment


class WalReader:
    """Decodes events at index positions; ``paths`` is the writer's growing segment list."""

    def __init__(self, paths: list[Path], max_record_bytes: int) -> None:
        self._paths = paths
        self._max_record_bytes = max_record_bytes
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def _fd(self, segment_id: int) -> int:
        fd = self._fds.get(segment_id)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(segment_id)
            if fd is None:
                fd = os.open(self._paths[segment_id], os.O_RDONLY)
                self._fds[segment_id] = fd
            return fd

    def read_positions(self, positions: list[Position]) -> list[Event]:
        """Decode the events at ``positions``, in their order (blocking file I/O)."""
        events: list[Event] = []
        i = 0
        while i < len(positions):
            first = positions[i]
            j = i + 1
            end = first.offset + first.length
            while (
                j < len(positions)
                and positions[j].segment_id == first.segment_id
                and positions[j].offset == end
            ):
                end += positions[j].length
                j += 1
            buf = os.pread(self._fd(first.segment_id), end - first.offset, first.offset)
            pos = 0
            for k in range(i, j):
                events.append(decode_frame_at(buf, pos))
                pos += positions[k].length
            i = j
        return events

    def read_all(self) -> list[Event]:
        """Every durable event in seq order (blocking; tests and tools, not hot paths)."""
        out: list[Event] = []
        for path in list(self._paths):
            buf = path.read_bytes()
            outcome = ScanOutcome()
            expect = out[-1].seq + 1 if out else 1
            for info in scan_segment(
                buf, expect, outcome, is_last=True, max_record_bytes=self._max_record_bytes
            ):
                out.append(decode_frame_at(buf, info.offset))
        return out

    def close(self) -> list[OSError]:
        """Close every descriptor; returns the errors instead of raising them."""
        with self._lock:
            fds = list(self._fds.values())
            self._fds.clear()
        errors: list[OSError] = []
        for fd in fds:
            try:
                os.close(fd)
            except OSError as exc:
                errors.append(exc)
        return errors
