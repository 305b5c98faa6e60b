"""Blocking calls on the event loop thread: what the ``no_blocking_on_loop`` fixture catches.

Rules:

- A thread that is running an asyncio event loop neither syncs a file to disk
  (``os.fsync``, ``os.fdatasync``: durable I/O belongs to the WAL writer thread or
  ``asyncio.to_thread``) nor decodes media with PyAV (a ``decode`` of a codec context,
  container, stream or packet: decoding belongs to the pipeline's worker threads). Such
  a call is recorded as an offence of the running test; the call itself still runs.
- fsync and fdatasync are replaced, for the test, by wrappers (``monkeypatch``).
- PyAV's objects are Cython types whose methods cannot be replaced, so decodes are
  watched instead, with a ``sys.monitoring`` tool (PEP 669) on CALL events, installed
  once per test session (:class:`DecodeWatch`). Its callback sees each call site's
  callable: a site calling anything but a PyAV ``decode`` is switched off for good after
  its first call (``sys.monitoring.DISABLE``), so once the suite has warmed up only decode
  sites still call back, each decode paying one Python-level check (the decode itself
  costs far more).
- What it cannot see: calls made from C (a callback the loop itself runs, Cython calling
  Cython) are not CALL events, and a call site whose callable varies (``fn(*args)``) is
  switched off by its first non-decode callee. Every decode in this code base is a
  direct method call (``decoder.decode(packet)``, ``container.decode(video=0)``), which
  the watch sees wherever it is written.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any

import pytest

SYNC_CALLS = ("fsync", "fdatasync")
"""The ``os`` functions that block on the disk."""

TOOL_ID = 4
"""The ``sys.monitoring`` tool id of :class:`DecodeWatch`. Not 0 (a debugger: pytest-timeout
then stops timing out), 1 (coverage), 2 (profilers), 5 (optimizers) or 3 (Hypothesis's
explain phase)."""


def on_loop_thread() -> bool:
    """True on a thread that is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _line_of(code: CodeType, offset: int) -> int | None:
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


def pyav_decode_owner(callable_: object) -> type | None:
    """The PyAV type whose ``decode`` ``callable_`` is (unbound or bound), else None."""
    if getattr(callable_, "__name__", None) != "decode":
        return None
    owner = getattr(callable_, "__objclass__", None)
    if owner is None:
        bound_to = getattr(callable_, "__self__", None)
        owner = type(bound_to) if bound_to is not None else None
    module = getattr(owner, "__module__", "") or ""
    return owner if isinstance(owner, type) and module.startswith("av.") else None


class DecodeWatch:
    """The ``sys.monitoring`` tool that reports PyAV decodes on a loop thread (module rules).

    :meth:`install` once per process; :meth:`recording` routes offences to a test's list.
    """

    def __init__(self) -> None:
        self._offences: list[str] | None = None
        self._installed = False

    def install(self) -> None:
        """Register the tool and turn CALL events on (idempotent)."""
        if self._installed:
            return
        monitoring = sys.monitoring
        holder = monitoring.get_tool(TOOL_ID)
        if holder is not None:
            raise RuntimeError(f"sys.monitoring tool id {TOOL_ID} is taken by {holder!r}")
        monitoring.use_tool_id(TOOL_ID, "whip-ingest tests: PyAV decode on the event loop")
        monitoring.register_callback(TOOL_ID, monitoring.events.CALL, self._on_call)
        monitoring.set_events(TOOL_ID, monitoring.events.CALL)
        self._installed = True

    def uninstall(self) -> None:
        """Turn the events off and free the tool id (idempotent)."""
        if not self._installed:
            return
        monitoring = sys.monitoring
        monitoring.set_events(TOOL_ID, monitoring.events.NO_EVENTS)
        monitoring.register_callback(TOOL_ID, monitoring.events.CALL, None)
        monitoring.free_tool_id(TOOL_ID)
        self._installed = False

    @contextmanager
    def recording(self, offences: list[str]) -> Iterator[list[str]]:
        """Append every decode on a loop thread to ``offences`` inside the block."""
        previous, self._offences = self._offences, offences
        try:
            yield offences
        finally:
            self._offences = previous

    def _on_call(self, code: CodeType, offset: int, callable_: object, arg0: object) -> Any:
        try:
            owner = pyav_decode_owner(callable_)
        except Exception:  # an exotic callable: not a decode
            owner = None
        if owner is None:
            return sys.monitoring.DISABLE  # this call site is never looked at again
        offences = self._offences
        if offences is not None and on_loop_thread():
            receiver = type(arg0) if isinstance(arg0, owner) else owner  # unbound: arg0 is self
            where = f"{code.co_filename}:{_line_of(code, offset)}"
            offences.append(f"PyAV {receiver.__name__}.decode in {code.co_qualname} ({where})")
        return None


def guard_sync_calls(monkeypatch: pytest.MonkeyPatch, offences: list[str]) -> None:
    """Replace ``os.fsync``/``os.fdatasync`` for the test with wrappers that record a call
    on a loop thread in ``offences`` (module rules)."""

    def guarded(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if on_loop_thread():
                offences.append(name)
            return real(*args, **kwargs)

        return wrapper

    for name in SYNC_CALLS:
        monkeypatch.setattr(os, name, guarded(name, getattr(os, name)))
