"""``registry.events.NewEvent``'s constructor, fast path in C: ``new_event``.

The pure-Python ``NewEvent.__new__`` of :mod:`registry.events` (kept there as ``_py_new``)
is the reference implementation and the slow path: every call the fast path does not take
goes to it unchanged, so results, errors and cache updates are the Python ones.
:func:`configure` must be called once before use; ``registry.events`` does so at import.
"""

from collections.abc import Callable
from typing import Any

from registry.events import NewEvent

def configure(
    py_new: Callable[..., NewEvent],
    valid_ids: set[str],
    valid_types: dict[str, str],
    cls: type[NewEvent],
    /,
) -> None:
    """Set the reference constructor, the caches it fills and the class (``NewEvent``)
    whose subclasses the fast path may build.

    The set and dict are kept by reference: clear them, never rebind them. Until this is
    called, :func:`new_event` raises RuntimeError.
    """

def new_event[E: NewEvent](
    cls: type[E],
    run_id: str,
    type: str,
    principal: str,
    data: dict[str, Any] | None = None,
    ts_ms: int | None = None,
) -> E:
    """``NewEvent.__new__``: the same instance or exception as ``_py_new(cls, ...)``."""
