"""Request parameters of the ``/v1`` API: who is calling, the query, path ids, cursors.

Bad input is 400 (never 500): path ids that are not ids (the registry's run-id syntax,
the session-id syntax of :mod:`whip.names`; ``..``, encoded slashes, NULs, ...),
non-integer or out-of-range ``limit``/``after``/``wait``, a malformed cursor, an unknown
``state``, a parameter given twice. Codes: ``bad_id``, ``invalid_parameter``,
``invalid_cursor``. Authentication comes first: :func:`caller` raises 401 before any
input is looked at.

Runs-page cursors: a keyset position (the last item's ``created_ms`` and id), base64url
without padding, so pages neither repeat nor skip runs when new runs arrive; only
meaningful with the same filters.
"""

from __future__ import annotations

import base64
import binascii
import math
import re

from aiohttp import web

from registry.events import is_valid_run_id
from registry.runs import RunView
from registry.timeline import MAX_CURSOR
from whip.auth import ForbiddenError, Principal, require_caller
from whip.errors import HttpError
from whip.names import SESSION_ID_RULE, is_principal_name, is_session_id, is_stream_name

DEFAULT_LIMIT = 100

_UINT = re.compile(r"[0-9]{1,25}")
_NUMBER = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,3})?")
_CURSOR = re.compile(r"[A-Za-z0-9_-]{4,400}")


class BadIdError(HttpError):
    """A path id that cannot be an id at all."""

    code = "bad_id"


class InvalidParameterError(HttpError):
    """A query parameter that is not what the API takes."""

    code = "invalid_parameter"


class InvalidListCursorError(HttpError):
    """A ``cursor`` that no answer of ours produced."""

    code = "invalid_cursor"


async def caller(request: web.Request) -> Principal:
    """The authenticated principal (401 first, whatever else is wrong; 503 when the
    auth hook or the JWT key set cannot answer): :func:`whip.auth.require_caller`."""
    return await require_caller(request)


def query(request: web.Request, name: str) -> str | None:
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise InvalidParameterError(f"{name} given more than once")
    return values[0] if values else None


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = query(request, name)
    if raw is None:
        return default
    if not _UINT.fullmatch(raw) or not low <= int(raw) <= high:
        raise InvalidParameterError(f"{name} must be an integer from {low} to {high}")
    return int(raw)


def seconds_param(request: web.Request, name: str, high: float) -> float:
    raw = query(request, name)
    if raw is None:
        return 0.0
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not 0.0 <= value <= high:  # also false for nan and inf
        raise InvalidParameterError(f"{name} must be a number of seconds from 0 to {high:g}")
    return value


def principal_filter(request: web.Request, caller: Principal) -> str | None:
    """The principal the caller may look at (module doc): None means everyone."""
    named = query(request, "principal")
    if named is not None and not is_principal_name(named):
        raise InvalidParameterError("principal must be a principal name")
    if caller.is_operator:
        return named
    if named is not None and named != caller.name:
        raise ForbiddenError("the principal filter naming others is for operators")
    return caller.name


def stream_filter(request: web.Request) -> str | None:
    stream = query(request, "stream")
    if stream and not is_stream_name(stream):
        raise InvalidParameterError("stream must be empty or 1-64 chars of [A-Za-z0-9_.-]")
    return stream


def run_id_param(request: web.Request) -> str:
    run_id = request.match_info["run_id"]
    if not is_valid_run_id(run_id):
        raise BadIdError("run ids are 1-128 chars of [A-Za-z0-9_.:-], starting alphanumeric")
    return run_id


def opaque_cursor(position: str) -> str:
    """A list's opaque ``next``: ``position`` (ASCII) in unpadded base64url."""
    return base64.urlsafe_b64encode(position.encode("ascii")).decode("ascii").rstrip("=")


def cursor_position(cursor: str, max_chars: int = 400) -> str:
    """What :func:`opaque_cursor` wrapped; :class:`InvalidListCursorError` (400) for
    anything it cannot have made (at most ``max_chars`` characters)."""
    if len(cursor) > max_chars or not _CURSOR.fullmatch(cursor):
        raise InvalidListCursorError("cursor is not one this server gave out")
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError) as exc:
        raise InvalidListCursorError("cursor is not one this server gave out") from exc


def encode_cursor(view: RunView) -> str:
    """The opaque ``next`` of a runs page ending at ``view``."""
    return opaque_cursor(f"{view.created_ms}.{view.run_id}")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The sort key in ``cursor``; 400 for anything :func:`encode_cursor` cannot make."""
    bad = InvalidListCursorError("cursor is not one this server gave out")
    created, _, run_id = cursor_position(cursor).partition(".")
    if not _UINT.fullmatch(created) or int(created) > MAX_CURSOR or not is_valid_run_id(run_id):
        raise bad
    return int(created), run_id


def session_id_param(request: web.Request) -> str:
    """The ``{session_id}`` path id; 400 for anything that cannot be one."""
    session_id = request.match_info["session_id"]
    if not is_session_id(session_id):
        raise BadIdError(f"session ids are {SESSION_ID_RULE}")
    return session_id
