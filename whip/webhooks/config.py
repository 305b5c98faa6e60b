"""``[[webhooks]]``: what a webhook entry is, and the checks that refuse a bad one.

Rules:

- Entries exist only in the config file (an array of tables, like ``[[principals]]``);
  a ``WHIP_INGEST_WEBHOOKS_*`` variable is an error. Keys: ``url`` and ``secret`` are
  required; ``name``, ``events``, ``principals``, ``timeout_s``, ``retry_min_s``,
  ``retry_max_s``, ``max_parallel_runs`` are optional (:data:`WEBHOOK_KEYS` documents
  each, and the README's reference is generated from it). Any other key is an error.
- ``url``: ``http://`` or ``https://`` with a host, no user or password (it would be
  logged), no fragment.
- ``secret``: the Standard Webhooks form ``whsec_<base64>``, decoding to 24..64 bytes.
  It is kept out of every ``repr`` and log line.
- ``events``: event type names (the registry's syntax), at least one, none twice.
  Default: the lifecycle types plus ``stream_warning`` (:data:`DEFAULT_EVENTS`).
- ``principals``: principal names; empty (the default) is every principal.
- ``name``: names the webhook in metrics, ``GET /v1/webhooks``, logs and the cursor file;
  1-64 of ``[A-Za-z0-9._-]`` starting alphanumeric. Default: derived from the URL's host,
  port and path (:func:`derived_name`). Names are unique: two entries that derive the
  same one must be given names.
- Numbers within bounds: ``timeout_s`` 0.05..120 (default 5), ``retry_min_s`` 0.01..600
  (default 1), ``retry_max_s`` ``retry_min_s``..86400 (default 600),
  ``max_parallel_runs`` 1..256 (default 8).
- Every problem is a :class:`WebhookEntryError` naming the entry's number; the config
  package turns it into its ``ConfigError`` with the file's label (this module imports
  nothing of :mod:`whip.config`, which imports it). Pure: nothing is resolved or fetched.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SECRET_PREFIX = "whsec_"
DEFAULT_EVENTS: tuple[str, ...] = (
    "run_created",
    "session_connected",
    "first_frame",
    "stop_requested",
    "session_closed",
    "worker_fault",
    "forced_shutdown",
    "run_interrupted",
    "run_deleted",
    "stream_warning",
)
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""The registry's event type syntax (:mod:`registry.events`)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1-64 chars of [A-Za-z0-9._-], starting alphanumeric"


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """One ``[[webhooks]]`` entry, checked; ``secret_key`` is the decoded secret."""

    name: str
    url: str
    secret_key: bytes = field(repr=False)
    events: tuple[str, ...] = DEFAULT_EVENTS
    principals: tuple[str, ...] = ()
    timeout_s: float = 5.0
    retry_min_s: float = 1.0
    retry_max_s: float = 600.0
    max_parallel_runs: int = 8

    def wants(self, event_type: str, principal: str) -> bool:
        """Whether an event of this type and principal is delivered to this webhook."""
        return event_type in self.events and (not self.principals or principal in self.principals)


WEBHOOK_KEYS: dict[str, tuple[str, str, str]] = {
    # key: (type as the reference writes it, default as TOML, description)
    "url": ("string", "(required)", "http:// or https:// URL the events are POSTed to"),
    "secret": (
        "string",
        "(required)",
        "Standard Webhooks signing secret, whsec_ and base64 of 24-64 bytes",
    ),
    "name": (
        "string",
        "(from the URL)",
        "names the webhook in metrics, GET /v1/webhooks, logs and the cursor file (unique)",
    ),
    "events": (
        "list of string",
        "[" + ", ".join(f'"{t}"' for t in DEFAULT_EVENTS) + "]",
        "event types delivered",
    ),
    "principals": ("list of string", "[]", "only these principals' events ([]: everyone's)"),
    "timeout_s": ("float", "5.0", "one delivery attempt's deadline, connect to last byte"),
    "retry_min_s": ("float", "1.0", "first retry delay (doubled per failure, with jitter)"),
    "retry_max_s": ("float", "600.0", "longest retry delay"),
    "max_parallel_runs": (
        "integer",
        "8",
        "runs delivered at once (each run in order, one event at a time)",
    ),
}
_REQUIRED = frozenset({"url", "secret"})


class WebhookEntryError(ValueError):
    """A ``[[webhooks]]`` entry that must not be started; ``key`` is ``webhooks[N]``."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def decode_secret(secret: str) -> bytes:
    """The key bytes of a ``whsec_<base64>`` secret; ValueError when it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"must be {SECRET_PREFIX} followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"must decode to 24-64 bytes, got {len(key)}")
    return key


def check_url(url: str) -> None:
    """ValueError unless ``url`` is an http(s) URL with a host, no credentials or fragment."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("must name a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry a user or password")
    if parts.fragment:
        raise ValueError("must not have a #fragment")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None


def derived_name(url: str) -> str:
    """A webhook name from its URL: host, port and path, other characters as ``-``."""
    parts = urlsplit(url)
    text = parts.hostname or "webhook"
    if parts.port is not None:
        text += f"-{parts.port}"
    text += parts.path
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return (name or "webhook")[:64].rstrip("-._") or "webhook"


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings")
    if len(set(value)) != len(value):
        raise ValueError(f"{what} names one value twice")
    return tuple(value)


def _number(entry: dict[str, object], key: str, default: float, lo: float, hi: float) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    if not lo <= value <= hi:
        raise ValueError(f"{key} must be from {lo:g} to {hi:g}, got {value}")
    return float(value)


def _entry(entry: dict[str, object]) -> WebhookConfig:
    """One entry, or ValueError naming the key at fault."""
    unknown = sorted(set(entry) - set(WEBHOOK_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} (known: {', '.join(WEBHOOK_KEYS)})")
    missing = sorted(_REQUIRED - set(entry))
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    url, secret = entry["url"], entry["secret"]
    if not isinstance(url, str):
        raise ValueError("url must be a string")
    try:
        check_url(url)
    except ValueError as exc:
        raise ValueError(f"url {exc}") from None
    if not isinstance(secret, str):
        raise ValueError("secret must be a string")
    try:
        key = decode_secret(secret)
    except ValueError as exc:
        raise ValueError(f"secret {exc}") from None
    name = entry.get("name", derived_name(url))
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be {NAME_RULE}")
    events = _strings(entry.get("events", list(DEFAULT_EVENTS)), "events")
    if not events:
        raise ValueError("events must name at least one event type")
    for event_type in events:
        if not _EVENT_TYPE.fullmatch(event_type):
            raise ValueError(f"events: {event_type!r} is not an event type")
    principals = _strings(entry.get("principals", []), "principals")
    for principal in principals:
        if not _NAME.fullmatch(principal):
            raise ValueError(f"principals: {principal!r} is not a principal name")
    timeout_s = _number(entry, "timeout_s", 5.0, 0.05, 120.0)
    retry_min_s = _number(entry, "retry_min_s", 1.0, 0.01, 600.0)
    retry_max_s = _number(entry, "retry_max_s", 600.0, retry_min_s, 86400.0)
    parallel = entry.get("max_parallel_runs", 8)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= 256:
        raise ValueError("max_parallel_runs must be an integer from 1 to 256")
    return WebhookConfig(
        name=name,
        url=url,
        secret_key=key,
        events=events,
        principals=principals,
        timeout_s=timeout_s,
        retry_min_s=retry_min_s,
        retry_max_s=retry_max_s,
        max_parallel_runs=parallel,
    )


def parse_webhooks(raw: object) -> tuple[WebhookConfig, ...]:
    """The ``[[webhooks]]`` array, checked entry by entry; the first problem is a
    :class:`WebhookEntryError` naming the entry's number."""
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise WebhookEntryError("must be an array of tables", key="webhooks")
    result: list[WebhookConfig] = []
    for number, entry in enumerate(raw, start=1):
        try:
            webhook = _entry(entry)
            if webhook.name in {w.name for w in result}:
                raise ValueError(
                    f"name {webhook.name!r} is already taken by another webhook "
                    "(give each entry its own name)"
                )
        except ValueError as exc:
            raise WebhookEntryError(f"#{number}: {exc}", key=f"webhooks[{number}]") from None
        result.append(webhook)
    return tuple(result)
