"""The source text of an aiortc/aioice object, for the ``internals_problems()`` checks.

:func:`source_text` is ``inspect.getsource`` that answers ``""`` where no source can be
read (a C function, a frozen module), so a check reads "the expected line is missing"
instead of raising.
"""

from __future__ import annotations

import inspect


def source_text(obj: object) -> str:
    """``obj``'s source, or ``""`` when it has none to read."""
    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""
