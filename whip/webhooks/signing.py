"""Standard Webhooks messages: the id, the body and the signature of one delivery.

Rules (standardwebhooks.com, version 1 signatures):

- ``webhook-id`` is stable for one event: ``{run_id}:{seq}`` (:func:`message_id`), the
  same on every retry and after a restart, so a receiver deduplicates by it. Cluster seqs
  are per run, and a run id that retention evicted can be made again by a DELETE (a run
  whose one event is ``run_deleted`` at seq 1): given the run row's incarnation, that
  event's id is ``{run_id}:1.{incarnation}``, so it never repeats the first run's
  ``{run_id}:1``. Embedded seqs are global: there the id is unique without it.
- ``webhook-timestamp`` is the attempt's time, integer seconds since the epoch (receivers
  refuse stale timestamps, so a retry is signed afresh).
- ``webhook-signature`` is ``v1,`` and the base64 of HMAC-SHA256 over
  ``"{id}.{timestamp}.{body}"`` with the decoded secret (:func:`signature`).
- The body is ``{"type", "timestamp", "data"}``: the event's type, its time as ISO 8601
  (UTC, milliseconds), and the event object exactly as ``GET /v1/runs/{id}/events``
  renders it (:meth:`registry.events.Event.to_json`). It is built once per event and the
  same bytes are sent on every attempt, by every webhook: :func:`message_body` keeps the
  last :data:`BODY_CACHE_SIZE` bodies by the event object itself (its identity, the
  event held beside the body so that the identity cannot be reused while cached). The
  timeline's warm reads hand every webhook of the process the same event objects, so with
  10 webhooks 9 in 10 bodies were rebuilt before; an equal event read anew (a cold read,
  the cluster store) is simply built again. Keyed by identity, not by ``(run_id, seq)``:
  two timelines in one process (tests, benches) may hold different events under one
  id. The cache has its own lock (any thread may call); evicted oldest first.
- Pure otherwise: no I/O, no clock except where the caller passes one in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time

import orjson

from registry.events import Event, EventType

SIGNATURE_VERSION = "v1"

BODY_CACHE_SIZE = 4096
"""Bodies kept by :func:`message_body` (a few MB at most: events are small)."""

_bodies: dict[int, tuple[Event, bytes]] = {}
_bodies_lock = threading.Lock()


def message_id(event: Event, incarnation: int | None = None) -> str:
    """The event's ``webhook-id``: the same for every attempt, in every process (module
    rules; ``incarnation``: the cluster run row's)."""
    if incarnation is not None and event.seq == 1 and event.type == EventType.RUN_DELETED:
        return f"{event.run_id}:1.{incarnation}"
    return f"{event.run_id}:{event.seq}"


def iso_timestamp(ts_ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC (``2026-12-01T16:09:12.345Z``)."""
    seconds, millis = divmod(ts_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds)) + f"{millis:03d}Z"


def message_body(event: Event) -> bytes:
    """The JSON body of the event's delivery (module rules), built once per event."""
    key = id(event)
    cached = _bodies.get(key)
    if cached is not None and cached[0] is event:
        return cached[1]
    body = orjson.dumps(
        {"type": event.type, "timestamp": iso_timestamp(event.ts_ms), "data": event.to_json()}
    )
    with _bodies_lock:
        _bodies[key] = (event, body)
        while len(_bodies) > BODY_CACHE_SIZE:
            del _bodies[next(iter(_bodies))]
    return body


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` with the decoded secret."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The request headers of one attempt."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, msg_id, timestamp, body),
    }
