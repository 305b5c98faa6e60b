"""``[[webhooks]]`` entries: defaults, derived names, and a clear error for each bad field."""

from __future__ import annotations

import base64

import pytest

from whip.config import ConfigError, build_config, render_reference
from whip.webhooks.config import DEFAULT_EVENTS, derived_name

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def hooks(*entries: dict[str, object]) -> tuple[object, ...]:
    return build_config({"webhooks": list(entries)}, {}, {}).webhooks


def refused(*entries: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        build_config({"webhooks": list(entries)}, {}, {})
    return caught.value


def test_defaults_and_a_name_derived_from_the_url() -> None:
    (hook,) = build_config(
        {"webhooks": [{"url": "https://hooks.example.com:8443/in/whip?k=1", "secret": SECRET}]},
        {},
        {},
    ).webhooks
    assert hook.name == "hooks.example.com-8443-in-whip"
    assert hook.events == DEFAULT_EVENTS and "stream_warning" in hook.events
    assert hook.principals == () and hook.timeout_s == 5.0
    assert (hook.retry_min_s, hook.retry_max_s, hook.max_parallel_runs) == (1.0, 600.0, 8)
    assert hook.secret_key == bytes(range(32))
    assert "whsec" not in repr(hook) and str(bytes(range(32))) not in repr(hook)
    assert hook.wants("run_created", "anyone") and not hook.wants("stats", "anyone")
    assert derived_name("http://[::1]/") == "1"


def test_filters_and_names_are_kept() -> None:
    (hook,) = hooks(
        {
            "url": "http://127.0.0.1:9/x",
            "secret": SECRET,
            "name": "crm",
            "events": ["run_created", "motion_start"],
            "principals": ["studio-a"],
            "timeout_s": 0.5,
        }
    )
    assert (hook.name, hook.events, hook.principals) == (
        "crm",
        ("run_created", "motion_start"),
        ("studio-a",),
    )
    assert hook.wants("run_created", "studio-a") and not hook.wants("run_created", "studio-b")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"secret": SECRET}, "missing key(s) ['url']"),
        ({"url": "ftp://h/x", "secret": SECRET}, "url must be an http:// or https:// URL"),
        ({"url": "http:///x", "secret": SECRET}, "url must name a host"),
        ({"url": "http://u:p@h/x", "secret": SECRET}, "must not carry a user or password"),
        ({"url": "http://h:99999/x", "secret": SECRET}, "invalid port"),
        ({"url": "http://h/", "secret": "abc"}, "secret must start with 'whsec_'"),
        ({"url": "http://h/", "secret": "whsec_***"}, "followed by base64"),
        ({"url": "http://h/", "secret": "whsec_" + base64.b64encode(b"short").decode()}, "24-64"),
        ({"url": "http://h/", "secret": SECRET, "events": []}, "at least one"),
        ({"url": "http://h/", "secret": SECRET, "events": ["Run Created"]}, "not an event type"),
        ({"url": "http://h/", "secret": SECRET, "events": ["a", "a"]}, "twice"),
        ({"url": "http://h/", "secret": SECRET, "principals": "studio"}, "list of strings"),
        ({"url": "http://h/", "secret": SECRET, "timeout_s": 0}, "timeout_s must be from"),
        ({"url": "http://h/", "secret": SECRET, "timeout_s": True}, "timeout_s must be a number"),
        ({"url": "http://h/", "secret": SECRET, "retry_min_s": 5, "retry_max_s": 1}, "retry_max_s"),
        ({"url": "http://h/", "secret": SECRET, "max_parallel_runs": 0}, "max_parallel_runs"),
        ({"url": "http://h/", "secret": SECRET, "name": "-x"}, "name must be"),
        ({"url": "http://h/", "secret": SECRET, "retries": 3}, "unknown key(s) ['retries']"),
    ],
)
def test_each_bad_field_is_a_clear_config_error(entry: dict[str, object], message: str) -> None:
    error = refused(entry)
    assert message in str(error), str(error)
    assert error.key == "webhooks[1]" and error.source == "config file"
    assert "#1" in str(error)


def test_names_are_unique_and_the_array_is_file_only() -> None:
    same = {"url": "http://h/x", "secret": SECRET}
    error = refused(same, {**same, "events": ["run_created"]})
    assert "#2" in str(error) and "already taken" in str(error)
    assert hooks({**same, "name": "a"}, {**same, "name": "b"})
    assert "array of tables" in str(refused("http://h/x"))
    with pytest.raises(ConfigError, match="file only"):
        build_config({}, {"WHIP_INGEST_WEBHOOKS_URL": "http://h/"}, {})


def test_the_reference_lists_every_webhook_key() -> None:
    table = render_reference()
    for key in ("url", "secret", "name", "events", "principals", "timeout_s", "retry_max_s"):
        assert f"`[[webhooks]] {key}`" in table


def test_webhooks_are_accepted_in_cluster_mode() -> None:
    cluster = {"cluster": {"store": "postgresql://127.0.0.1:1/none", "secret": "s" * 16}}
    hooks = {"webhooks": [{"url": "http://127.0.0.1:9/hook", "secret": SECRET}]}
    assert build_config({**cluster, **hooks}, {}, {}).webhooks  # the store keeps the cursors
    assert build_config(hooks, {}, {}).webhooks  # single node: the data dir does
