"""Standard Webhooks messages, checked by the ``standardwebhooks`` package itself."""

from __future__ import annotations

import base64
import json
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from registry.events import Event
from whip.webhooks.signing import headers, iso_timestamp, message_body, message_id

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
