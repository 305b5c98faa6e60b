"""``/v1/runs/{id}/recordings`` routes: a run's segments, one segment's file, deletion.

- ``GET /v1/runs/{id}/recordings``: the run's complete segments by index,
  ``{"items": [{"name", "index", "bytes", "duration_ms", "start_ms", "url"}], "next"}``
  and ``recording_bytes`` (of all the run's segments, whatever the page). Paged like the
  other lists: ``limit`` (1..1000, default 100) and ``cursor``, the opaque ``next`` of the
  previous page (null on the last). The cursor is a keyset position, the last listed
  segment's index (:func:`encode_cursor`), so a page neither repeats nor skips a segment
  when segments complete or are evicted between pages; a cursor this server cannot have
  made is 400 ``invalid_cursor``, a bad ``limit`` 400 ``invalid_parameter``. A segment
  being written is not listed until it is complete.
- ``GET /v1/runs/{id}/recordings/{name}``: the file (``video/mp4`` or
  ``video/x-matroska``), with ``Range`` (aiohttp's ``FileResponse``: 206 with
  ``Content-Range``, 416 for a range past the end) and ``Accept-Ranges: bytes``.
- ``DELETE /v1/runs/{id}/recordings`` (operators only, 403 otherwise): every segment of
  the run; 200 ``{"deleted": N, "bytes": B}``; 409 ``recording_live`` while the run is
  being recorded. It works for a run the registry no longer remembers too (recordings
  outlive their runs).

Isolation is the runs': the run must be visible to the caller (another principal's run is
404 ``not_found``, like one that does not exist). A name is valid only as
:data:`pipeline.recording.store.NAME_RE` says; anything else (``..``, a slash, an encoded
one) is 404 ``not_found`` before any path is built, and a valid name that is not a
listed complete segment is 404 too.
"""

from __future__ import annotations

import asyncio
import re

from aiohttp import web

from pipeline.recording.store import segment_index
from registry.timeline import MAX_READ_LIMIT
from whip.api_params import (
    DEFAULT_LIMIT,
    InvalidListCursorError,
    caller,
    cursor_position,
    int_param,
    opaque_cursor,
    query,
    run_id_param,
)
from whip.appkeys import SESSIONS_KEY
from whip.auth import Role, require_caller
from whip.errors import HttpError, NotFoundError
from whip.ratelimit import guarded

CONTENT_TYPES = {".mp4": "video/mp4", ".mkv": "video/x-matroska"}
_CURSOR_PREFIX = "segment."
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


class RecordingLiveError(HttpError):
    """The run is being recorded now: its files cannot be deleted under the recorder."""

    http_status = 409
    code = "recording_live"


def encode_cursor(index: int) -> str:
    """The opaque ``next`` of a recordings page whose last segment is ``index``."""
    return opaque_cursor(f"{_CURSOR_PREFIX}{index}")


def decode_cursor(cursor: str) -> int:
    """The segment index in ``cursor``; 400 for anything :func:`encode_cursor` cannot make."""
    raw = cursor_position(cursor, max_chars=40)
    prefix, index = raw[: len(_CURSOR_PREFIX)], raw[len(_CURSOR_PREFIX) :]
    if prefix != _CURSOR_PREFIX or not _INDEX.fullmatch(index):
        raise InvalidListCursorError("cursor is not one this server gave out")
    return int(index)


async def list_recordings(request: web.Request) -> web.Response:
    who = await caller(request)
    run_id = run_id_param(request)
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_READ_LIMIT)
    cursor = query(request, "cursor")
    after = decode_cursor(cursor) if cursor is not None else None
    manager = request.app[SESSIONS_KEY]
    await manager.runs.visible(run_id, who)
    store = manager.recordings.store
    listed = [
        (index, entry)
        for entry in store.segments(run_id)
        if (index := segment_index(entry.name)) is not None and (after is None or index > after)
    ]
    page = listed[:limit]
    items = [
        {
            "name": entry.name,
            "index": index,
            "bytes": entry.bytes,
            "duration_ms": entry.duration_ms,
            "start_ms": entry.start_ms,
            "url": f"/v1/runs/{run_id}/recordings/{entry.name}",
        }
        for index, entry in page
    ]
    more = len(listed) > limit
    return web.json_response(
        {
            "items": items,
            "next": encode_cursor(page[-1][0]) if more else None,
            "recording_bytes": store.run_bytes(run_id),
        }
    )


async def get_recording(request: web.Request) -> web.StreamResponse:
    who = await caller(request)
    run_id = run_id_param(request)
    manager = request.app[SESSIONS_KEY]
    await manager.runs.visible(run_id, who)
    name = request.match_info["name"]
    store = manager.recordings.store
    path = store.path(run_id, name)
    if path is None or not store.has(run_id, name):
        raise NotFoundError("recording")
    response = web.FileResponse(
        path,
        headers={
            "Content-Type": CONTENT_TYPES.get(path.suffix, "application/octet-stream"),
            "Accept-Ranges": "bytes",
            "Cache-Control": "no-store",
        },
    )
    return response


@guarded
async def delete_recordings(request: web.Request) -> web.Response:
    await require_caller(request, Role.OPERATOR)
    run_id = run_id_param(request)
    manager = request.app[SESSIONS_KEY]
    recordings = manager.recordings
    if recordings.is_recording(run_id):
        raise RecordingLiveError("the run is being recorded; stop it first")
    count = len(recordings.store.segments(run_id))
    if count == 0 and await manager.timeline.get_run(run_id) is None:
        raise NotFoundError("run")
    freed = await asyncio.to_thread(recordings.store.delete_run, run_id)
    return web.json_response({"deleted": count, "bytes": freed})


def add_recording_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/v1/runs/{run_id}/recordings", list_recordings, allow_head=False)
    router.add_get("/v1/runs/{run_id}/recordings/{name}", get_recording, allow_head=False)
    router.add_delete("/v1/runs/{run_id}/recordings", delete_recordings)
