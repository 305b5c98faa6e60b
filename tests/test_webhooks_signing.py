"""Standard Webhooks messages, checked by the ``standardwebhooks`` package itself."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from registry.events import Event
from whip.webhooks import signing
from whip.webhooks.signing import (
    BODY_CACHE_SIZE,
    headers,
    iso_timestamp,
    message_body,
    message_id,
)

KEY = bytes(range(7, 39))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
EVENT = Event(41, "r_abc", "session_closed", 1764605352345, "studio-a", {"reason": "deleted"})


def test_the_package_verifies_our_signature_and_body() -> None:
    body = message_body(EVENT)
    sent = headers(KEY, message_id(EVENT), int(time.time()), body)
    assert sent["webhook-id"] == "r_abc:41" and sent["webhook-signature"].startswith("v1,")
    payload = Webhook(SECRET).verify(body, sent)
    assert payload == {
        "type": "session_closed",
        "timestamp": "2025-12-01T16:09:12.345Z",
        "data": EVENT.to_json(),
    }
    assert json.loads(body)["data"] == {
        "seq": 41,
        "run_id": "r_abc",
        "type": "session_closed",
        "ts_ms": 1764605352345,
        "principal": "studio-a",
        "data": {"reason": "deleted"},
    }
    tampered = body.replace(b"deleted", b"stopped")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, sent)
    other = "whsec_" + base64.b64encode(bytes(32)).decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, sent)


def test_the_id_is_stable_and_the_timestamp_is_iso_utc() -> None:
    assert message_id(EVENT) == "r_abc:41" == message_id(EVENT._replace(data={"x": 1}))
    assert message_id(EVENT) != message_id(EVENT._replace(seq=42))
    assert iso_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert iso_timestamp(1_000_007) == "1970-01-01T00:16:40.007Z"


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=0, max_value=253_402_300_799_999))  # up to 9999-12-31
def test_the_timestamp_is_the_datetime_rendering_to_the_millisecond(ts_ms: int) -> None:
    moment = datetime.fromtimestamp(ts_ms // 1000, tz=UTC)
    expected = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"
    assert iso_timestamp(ts_ms) == expected


def test_a_body_is_built_once_per_event_object_and_never_for_another() -> None:
    first = message_body(EVENT)
    assert message_body(EVENT) is first  # every webhook of the process shares it
    # The same run and seq with other data (another timeline in this process) is its own body.
    other = EVENT._replace(data={"reason": "stopped"})
    assert json.loads(message_body(other))["data"]["data"] == {"reason": "stopped"}
    assert json.loads(message_body(EVENT))["data"]["data"] == {"reason": "deleted"}


def test_the_body_cache_stays_bounded_and_right_under_many_threads() -> None:
    events = [EVENT._replace(seq=n, data={"n": n}) for n in range(3 * BODY_CACHE_SIZE)]
    errors: list[str] = []
    start = threading.Barrier(8)

    def work(offset: int) -> None:
        start.wait()
        for index in range(offset, len(events), 3):
            event = events[index]
            for _ in range(2):
                if json.loads(message_body(event))["data"]["data"] != {"n": event.seq}:
                    errors.append(f"seq {event.seq}: another event's body")

    threads = [threading.Thread(target=work, args=(i % 3,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(signing._bodies) <= BODY_CACHE_SIZE
