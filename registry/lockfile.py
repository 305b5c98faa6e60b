"""One process per data directory: an exclusive ``flock`` on ``<data_dir>/LOCK``.

The kernel drops the lock when the holder dies (even by SIGKILL), so a crashed server
never blocks its own restart, while a second live process fails fast.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from registry.errors import DataDirLockedError


class DataDirLock:
    """Holds the data directory's lock until :meth:`release` (idempotent)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "LOCK"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`DataDirLockedError` at once, naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLockedError(
                f"data dir {self.path.parent} is in use by another process (pid {holder}); "
                "one server per data dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
