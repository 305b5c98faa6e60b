"""How one key is documented and checked beyond its type (:class:`Rule`), in a module of
its own so that section modules beside :mod:`whip.config.schema` can declare their keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Rule(NamedTuple):
    """How one key is documented and checked beyond its type."""

    doc: str
    lo: float | None = None
    hi: float | None = None
    check: Callable[[Any], None] | None = None
