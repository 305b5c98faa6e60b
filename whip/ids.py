"""Ids of sessions and runs: unguessable, and injectable.

:func:`new_id` is the production factory (128 bits from the OS CSPRNG, URL-safe). The
session manager takes an :data:`IdFactory` so a test can force a collision without
patching a module global.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

IdFactory = Callable[[str], str]
"""``new_id(prefix) -> prefix + random text``."""


def new_id(prefix: str) -> str:
    """An unguessable id (128 bits from the OS CSPRNG)."""
    return f"{prefix}{secrets.token_urlsafe(16)}"
