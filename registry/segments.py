"""Segment files: naming, the active segment, preallocation, rotation and rollback.

Rules:

- A segment is named after the seq of its first record (:func:`segment_name`: 20 digits
  and ``.wal``), so the names sort in log order (:func:`segment_paths`). A segment's id
  is its place in that order; positions in the index are ``segment id | offset``.
- Only the last segment (the *active* one) is ever written, only by the writer thread,
  and only after its last frame. Its directory entry is made durable before any record
  goes into it.
- The active segment is preallocated ahead of the writes (``posix_fallocate``, in steps
  of :data:`PREALLOCATE_BYTES`, never past ``segment_bytes`` unless one batch needs
  it): an ``fdatasync`` that does not have to grow the file is cheaper and does not
  queue behind other files' journal commits (figures in docs/PERFORMANCE.md). Where
  the filesystem cannot preallocate, segments grow per write.
- A segment is cut back to its last frame, durably, before the next one is created and
  on a clean close, so only the active segment of a log that crashed ends in zeros,
  which recovery truncates like any torn tail (see :mod:`registry.record`).
- A write that failed is rolled back by truncating the segment to its last frame;
  nothing of a failed batch stays in the file.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".wal"
PREALLOCATE_BYTES = 4 * 1024 * 1024
"""How far ahead of the writes the active segment is allocated at a time."""


def segment_name(first_seq: int) -> str:
    """File name of the segment whose first record has ``first_seq``."""
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def segment_paths(wal_dir: Path) -> list[Path]:
    """The segment files in ``wal_dir``, in log order."""
    return sorted(p for p in wal_dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))


def fsync_dir(path: Path) -> None:
    """Make ``path``'s entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class SegmentFiles:
    """The log's segment paths and the active segment's descriptor (writer thread only).

    ``paths`` is shared with the readers (:class:`~registry.wal_reader.WalReader`):
    it only ever grows, by one append per rotation.
    """

    def __init__(self, wal_dir: Path, segment_bytes: int) -> None:
        self.dir = wal_dir
        self.segment_bytes = segment_bytes
        self.paths: list[Path] = []
        self.size = 0
        """Bytes of intact frames in the active segment: where the next write goes."""
        self._fd: int | None = None
        self._allocated = 0
        """The active segment's file size: ``size`` plus preallocated, unwritten space."""
        self._preallocate = True

    @property
    def active_id(self) -> int:
        """The active segment's id (its index in :attr:`paths`)."""
        return len(self.paths) - 1

    def open_active(self, size: int) -> None:
        """After recovery: continue the last of :attr:`paths`, whose frames end at ``size``."""
        self.size = size
        self._fd = os.open(self.paths[-1], os.O_RDWR)
        self._allocated = os.fstat(self._fd).st_size

    def create(self, first_seq: int) -> None:
        """Start a new active segment for the records from ``first_seq``.

        The segment left behind is cut back to its last frame first (durably): recovery
        accepts zeros only where the writer may have stopped.
        """
        self.cut_preallocation()
        path = self.dir / segment_name(first_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fsync_dir(self.dir)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self.paths.append(path)
        self.size = 0
        self._allocated = 0

    def rotate_if_full(self, first_seq: int) -> None:
        """Start a new segment at ``first_seq`` once the active one reached its size."""
        if self.size >= self.segment_bytes:
            self.create(first_seq)

    def write(self, data: bytes) -> None:
        """Write ``data`` after the last frame (not yet durable, :meth:`sync` does that).

        Raises ``OSError``; then :meth:`rollback` before anything else.
        """
        fd = self._active_fd()
        self._preallocate_for(fd, self.size + len(data))
        _pwrite_all(fd, data, self.size)

    def rollback(self) -> None:
        """Cut the active segment back to its last frame (after a failed :meth:`write`)."""
        os.ftruncate(self._active_fd(), self.size)
        self._allocated = self.size

    def sync(self) -> None:
        """``fdatasync`` the active segment. A failure cannot be retried: the kernel may
        have dropped the dirty pages."""
        os.fdatasync(self._active_fd())

    def cut_preallocation(self) -> None:
        """Truncate the active segment's unwritten space and make that durable."""
        if self._fd is not None and self._allocated > self.size:
            os.ftruncate(self._fd, self.size)
            os.fdatasync(self._fd)
            self._allocated = self.size

    def close(self) -> None:
        """Release the active segment's descriptor (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _active_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("no active segment")
        return self._fd

    def _preallocate_for(self, fd: int, end: int) -> None:
        """Make sure the active segment is allocated up to ``end`` (and a step ahead)."""
        if not self._preallocate or end <= self._allocated:
            return
        target = max(end, min(self._allocated + PREALLOCATE_BYTES, self.segment_bytes))
        try:
            os.posix_fallocate(fd, self._allocated, target - self._allocated)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            logger.info("wal: %s cannot preallocate (%s); segments grow per write", self.dir, exc)
            self._preallocate = False
            return
        self._allocated = target
