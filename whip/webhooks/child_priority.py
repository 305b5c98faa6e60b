"""The webhook delivery child's CPU priority: ``SCHED_IDLE`` while it keeps up, ``nice``
when it starves.

Why (docs/PERFORMANCE.md, "Who takes the server's cores"): with the delivery child busy, the
server's loop thread and WAL writer were preempted 15-40 times as often, whatever the
child's ``nice``. The kernel places a waking thread on an idle CPU, and a CPU that runs a
``nice`` 10 task is not idle; a CPU that runs only ``SCHED_IDLE`` tasks counts as idle. So
at ``SCHED_IDLE`` the server's threads wake onto the child's CPU and take it at once. But a
``SCHED_IDLE`` task gets almost nothing of a CPU that a normal task keeps busy: on a
saturated host the deliveries would stop.

Rules:

- Two levels (:class:`Level`): ``IDLE`` (``SCHED_IDLE`` on every thread of the child) and
  ``NICE`` (``SCHED_OTHER``, :data:`~whip.webhooks.delivery_process.DELIVERY_NICE` below
  the server). Every child starts at ``NICE`` (its start indexes the log: a saturated host
  must not hold the server's start up) and is told to go ``IDLE`` once ready when that is
  the level (:func:`enter_sched_idle`, in the child, on each of its threads; the threads it
  starts later inherit it).
- ``IDLE`` is used only where it can be watched (:func:`idle_supported`: Linux's
  ``SCHED_IDLE`` and ``/proc/<pid>/task/<tid>/schedstat``); elsewhere the level stays
  ``NICE``: a starvation nobody can see is not risked.
- The server samples the child's run-queue wait (:class:`RunQueueWait`: the time its
  threads were runnable but not running) every :attr:`PriorityTuning.window_s` and feeds
  it to a :class:`PriorityGovernor` (pure, no I/O, on the server's loop):
  - at ``IDLE``, a wait of at least ``starved_fraction`` of the last ``starved_windows``
    windows together is a starvation: the level becomes ``NICE``. Together, not each:
    the kernel adds a wait to ``run_delay`` when the thread finally runs, so a starved
    ``SCHED_IDLE`` thread shows nothing for a window or two, then the whole wait at once.
    The server moves the child's threads back to ``SCHED_OTHER`` where the kernel lets it
    (:func:`leave_sched_idle`: ``CAP_SYS_NICE``, or an ``RLIMIT_NICE`` that allows the
    child's ``nice``); an unprivileged process cannot, and then the child is killed and
    replaced by a new one (:mod:`whip.webhooks.delivery_process`);
  - at ``NICE``, a wait under ``calm_fraction`` of every window for ``calm_s`` in a row
    brings the level back to ``IDLE`` (in place: any process may enter ``SCHED_IDLE``).
    The wait needed doubles with each such return, up to ``calm_max_s``, and is back to
    ``calm_s`` after ``stable_idle_s`` at ``IDLE`` without a starvation: a host that
    saturates again and again costs at most one replacement per ``calm_max_s``.
- What a change costs: entering ``IDLE`` nothing; leaving it in place nothing; leaving it
  by a replacement, the new child's start (it indexes the log), and the deliveries since
  the old child's last cursor save, sent again with the same ``webhook-id`` (at least once
  allows it).
"""

from __future__ import annotations

import enum
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")


class Level(enum.StrEnum):
    IDLE = "idle"
    NICE = "nice"


@dataclass(frozen=True, slots=True)
class PriorityTuning:
    """The governor's thresholds (module rules); tests shorten them."""

    window_s: float = 1.0
    starved_fraction: float = 0.5
    starved_windows: int = 2
    calm_fraction: float = 0.05
    calm_s: float = 60.0
    calm_max_s: float = 3600.0
    stable_idle_s: float = 3600.0


class PriorityGovernor:
    """Decides the child's level from its run-queue waits (module rules). Pure: the caller
    samples, applies the change it returns, and owns the instance (one loop)."""

    def __init__(self, tuning: PriorityTuning, *, available: bool) -> None:
        self.tuning = tuning
        self.available = available
        self.level = Level.IDLE if available else Level.NICE
        self.calm_needed_s = tuning.calm_s
        """How long the child must stay calm at ``NICE`` before ``IDLE`` again."""
        self.starvations = 0
        self._recent: deque[tuple[float, float]] = deque(maxlen=tuning.starved_windows)
        self._calm_for_s = 0.0
        self._idle_for_s = 0.0

    def observe(self, waited_s: float, elapsed_s: float) -> Level | None:
        """One window's wait; the new level when it changes, else ``None``."""
        if elapsed_s <= 0:
            return None
        fraction = waited_s / elapsed_s
        tuning = self.tuning
        if self.level is Level.IDLE:
            self._idle_for_s += elapsed_s
            if self._idle_for_s >= tuning.stable_idle_s:
                self.calm_needed_s = tuning.calm_s
            recent = self._recent
            recent.append((waited_s, elapsed_s))
            if len(recent) < tuning.starved_windows:
                return None
            waited = sum(w for w, _ in recent)
            if waited < tuning.starved_fraction * sum(e for _, e in recent):
                return None
            self.starvations += 1
            self.level = Level.NICE
            self._calm_for_s = 0.0
            return Level.NICE
        if not self.available:
            return None
        if fraction >= tuning.calm_fraction:
            self._calm_for_s = 0.0
            return None
        self._calm_for_s += elapsed_s
        if self._calm_for_s < self.calm_needed_s:
            return None
        self.calm_needed_s = min(self.calm_needed_s * 2, tuning.calm_max_s)
        self.level = Level.IDLE
        self._recent.clear()
        self._idle_for_s = 0.0
        return Level.IDLE


def _run_delay_ns(stat: Path) -> int:
    """The second field of a ``schedstat`` file: ns spent runnable on a run queue."""
    return int(stat.read_text().split()[1])


def idle_supported() -> bool:
    """Whether ``SCHED_IDLE`` exists and a process's run-queue wait can be read here."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        _run_delay_ns(PROC / "self" / "task" / str(os.getpid()) / "schedstat")
    except (OSError, ValueError, IndexError):
        return False
    return True


class RunQueueWait:
    """The run-queue wait of one process's threads, read from ``/proc`` (no disk I/O)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._seen: dict[str, int] = {}
        self.take()

    def take(self) -> float | None:
        """Seconds its threads waited since the last call (a new thread counts from its
        start); ``None`` once the process is gone."""
        try:
            tids = os.listdir(PROC / str(self.pid) / "task")
        except OSError:
            return None
        now: dict[str, int] = {}
        waited = 0
        for tid in tids:
            try:
                value = _run_delay_ns(PROC / str(self.pid) / "task" / tid / "schedstat")
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
            now[tid] = value
            waited += max(0, value - self._seen.get(tid, 0))
        self._seen = now
        return waited / 1e9


def thread_ids(pid: int) -> list[int]:
    """The threads of a process (empty once it is gone)."""
    try:
        return [int(tid) for tid in os.listdir(PROC / str(pid) / "task")]
    except OSError:
        return []


def _move_threads(pid: int, policy: int) -> tuple[int, bool]:
    """Every thread of ``pid`` not at ``policy`` moved to it (``nice`` kept): how many were
    moved, and whether the kernel refused one (a thread that ended meanwhile is skipped)."""
    moved, refused = 0, False
    for tid in thread_ids(pid):
        try:
            if os.sched_getscheduler(tid) != policy:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
                moved += 1
        except ProcessLookupError:
            continue
        except OSError:  # EPERM: leaving SCHED_IDLE without CAP_SYS_NICE or RLIMIT_NICE
            refused = True
    return moved, refused


def reset_to_normal_policy() -> int:
    """Every thread of this process at ``SCHED_OTHER`` (its ``nice`` kept); returns how many
    were moved. What the kernel refuses (leaving ``SCHED_IDLE`` unprivileged) stays.

    The delivery child calls it first: it inherits its parent's policy, and a server run
    at a real-time policy (``chrt``), or a test process in which a SVT-AV1 encoder was
    opened as root (libsvtav1 puts the opening thread and its own at ``SCHED_FIFO`` 99),
    must not make the webhooks real-time. Tests and benchmarks call it after such an
    encoder too."""
    return _move_threads(os.getpid(), os.SCHED_OTHER)[0]


def enter_sched_idle() -> int:
    """In the child: every thread of this process to ``SCHED_IDLE`` (module rules);
    returns how many were moved."""
    return _move_threads(os.getpid(), os.SCHED_IDLE)[0]


def leave_sched_idle(pid: int) -> bool:
    """In the server: every thread of ``pid`` back to ``SCHED_OTHER`` (its ``nice`` kept);
    ``False`` where the kernel refuses it (module rules)."""
    return not _move_threads(pid, os.SCHED_OTHER)[1]


def all_threads_at(pid: int, policy: int) -> bool:
    """Whether every thread of ``pid`` runs at ``policy`` (``False`` once it is gone)."""
    tids = thread_ids(pid)
    try:
        return bool(tids) and all(os.sched_getscheduler(t) == policy for t in tids)
    except ProcessLookupError:
        return False
