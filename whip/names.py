"""The validation vocabulary: what a stream name, a session id and a principal name are.

One definition of each, for every route and for the config. Run ids are the registry's
(:func:`registry.events.is_valid_run_id`), since the registry stores them.
"""

from __future__ import annotations

import re

from registry.events import is_valid_run_id

__all__ = ["is_principal_name", "is_session_id", "is_stream_name", "is_valid_run_id"]

_STREAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SESSION_ID = re.compile(r"s_[A-Za-z0-9_-]{22}")
"""``s_`` and 22 URL-safe characters: :func:`whip.ids.new_id` of 16 bytes."""
_PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

STREAM_RULE = "1-64 chars of [A-Za-z0-9_.-], starting alphanumeric"
SESSION_ID_RULE = "s_ and 22 chars of [A-Za-z0-9_-]"
PRINCIPAL_RULE = "1-64 chars of [A-Za-z0-9._-], starting alphanumeric"


def is_stream_name(text: str) -> bool:
    """A stream name (the ``{stream}`` of ``POST /whip/{stream}``)."""
    return _STREAM.fullmatch(text) is not None


def is_session_id(text: str) -> bool:
    """A session id as this server makes them."""
    return _SESSION_ID.fullmatch(text) is not None


def is_principal_name(text: str) -> bool:
    """A principal name (config ``[[principals]] name``, the ``principal=`` filter)."""
    return _PRINCIPAL.fullmatch(text) is not None
