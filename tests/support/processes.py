"""Whether a process is gone: the tests that kill a server and watch its children."""

from __future__ import annotations

import os
from pathlib import Path


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, not yet reaped by its new parent)."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
