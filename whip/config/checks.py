"""The configuration checks that go beyond one key: array-of-table entries and the
refusals of a whole configuration (the keys themselves: :mod:`whip.config.schema`).

Rules:

- ``[[principals]]`` entries need exactly ``name``, ``role`` and ``token_sha256`` (and may
  have ``record``, a boolean): a name of
  1-64 of ``A-Z a-z 0-9 . _ -`` starting alphanumeric, not ``anonymous`` (that one is
  anonymous mode's), unique; a role ``publisher`` or ``operator``; 64 hex digits, stored
  lowercase, no two principals with one token.
- ``[[webhooks]]`` entries: :mod:`whip.webhooks.config` (file only, like principals).
- ``[auth]`` (JWT, the auth hook) is declared in :mod:`whip.config.auth`, with its own
  refusals.
- Whole-config refusals (:func:`check_whole`): no principals, JWKS or auth hook while
  ``server.host`` is not loopback; the ``[auth]`` ones; fewer budget threads than one
  session's workers; a budget that cannot hold one audio+video session's queues; a WAL
  record larger than a segment; cluster mode without a shared secret of 16 characters or
  more, or with recording; an ICE port range that is neither 0/0 nor
  ``1 <= port_min <= port_max``.
- Pure: nothing here reads a file or the environment.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable

from whip.config.auth import check_auth
from whip.config.errors import ConfigError
from whip.config.schema import (
    ANONYMOUS,
    PRINCIPAL_DOCS,
    PRINCIPAL_OPTIONAL_DOCS,
    Config,
    PrincipalConfig,
    Role,
)
from whip.config.values import is_loopback
from whip.names import PRINCIPAL_RULE, is_principal_name
from whip.webhooks.config import WebhookConfig, WebhookEntryError, parse_webhooks

_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def parse_principals(raw: object, source: str) -> tuple[PrincipalConfig, ...]:
    """The ``[[principals]]`` array of ``source`` (the file's label), checked entry by
    entry; the first problem is a :class:`ConfigError` naming the entry's number."""
    where = f"{source} [[principals]]"
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise ConfigError(f"{where}: must be an array of tables", key="principals", source=source)
    result: list[PrincipalConfig] = []
    for number, entry in enumerate(raw, start=1):
        problem = None
        if (
            not set(PRINCIPAL_DOCS)
            <= set(entry)
            <= set(PRINCIPAL_DOCS) | set(PRINCIPAL_OPTIONAL_DOCS)
        ):
            problem = (
                f"needs exactly the keys {', '.join(PRINCIPAL_DOCS)} "
                f"(and optionally {', '.join(PRINCIPAL_OPTIONAL_DOCS)}), got {sorted(entry)}"
            )
        elif not isinstance(entry.get("record", False), bool):
            problem = "record must be a boolean"
        elif not isinstance(entry["name"], str) or not is_principal_name(entry["name"]):
            problem = f"name must be {PRINCIPAL_RULE}"
        elif entry["name"] == ANONYMOUS:
            problem = f"the name {ANONYMOUS!r} is reserved for anonymous mode"
        elif entry["role"] not in typing.get_args(Role):
            problem = f"role must be 'publisher' or 'operator', got {entry['role']!r}"
        elif not isinstance(entry["token_sha256"], str) or not _SHA256_HEX.fullmatch(
            entry["token_sha256"]
        ):
            problem = "token_sha256 must be 64 hex digits (the SHA-256 of the token)"
        elif entry["name"] in {p.name for p in result}:
            problem = f"name {entry['name']!r} appears twice"
        elif entry["token_sha256"].lower() in {p.token_sha256 for p in result}:
            problem = "two principals share one token"
        if problem is not None:
            key = f"principals[{number}]"
            raise ConfigError(f"{where} #{number}: {problem}", key=key, source=source)
        result.append(
            PrincipalConfig(
                entry["name"], entry["role"], entry["token_sha256"].lower(), entry.get("record")
            )
        )
    return tuple(result)


def parse_webhook_entries(raw: object, source: str) -> tuple[WebhookConfig, ...]:
    """The ``[[webhooks]]`` array of ``source`` (rules: :mod:`whip.webhooks.config`)."""
    try:
        return parse_webhooks(raw)
    except WebhookEntryError as exc:
        raise ConfigError(f"{source} [[webhooks]] {exc}", key=exc.key, source=source) from None


def check_whole(config: Config, source_of: Callable[[str], str]) -> None:
    """The refusals that involve more than one key; ``source_of("section.key")`` names
    where the blamed key's value came from (``"default"`` when nowhere)."""

    def refuse(dotted: str, message: str) -> ConfigError:
        source = source_of(dotted)
        return ConfigError(f"{dotted} ({source}): {message}", key=dotted, source=source)

    check_auth(config.auth, refuse)
    host = config.server.host
    if config.anonymous and not is_loopback(host):
        raise refuse(
            "server.host",
            f"{host!r} is not loopback and no [[principals]], JWKS or auth hook are "
            "configured: refusing to serve without authentication",
        )
    pipeline, limits = config.pipeline, config.limits
    if pipeline.workers_per_session > limits.media_budget_threads:
        raise refuse(
            "limits.media_budget_threads",
            f"{limits.media_budget_threads} is below "
            f"pipeline.workers_per_session ({pipeline.workers_per_session})",
        )
    if pipeline.media_bytes(2) > limits.media_budget_bytes:
        raise refuse(
            "limits.media_budget_bytes",
            f"{limits.media_budget_bytes} cannot hold one "
            f"audio+video session ({pipeline.media_bytes(2)} bytes: 2 x queue_depth "
            "x payload_limit_bytes)",
        )
    if config.wal.max_record_bytes > config.wal.segment_bytes:
        raise refuse("wal.max_record_bytes", "is larger than wal.segment_bytes")
    cluster = config.cluster
    if cluster.enabled and len(cluster.secret) < 16:
        # Blame what was set: the secret if it was given, else the store that needs it.
        given = source_of("cluster.secret") != "default"
        raise refuse(
            "cluster.secret" if given else "cluster.store",
            "cluster mode needs a shared secret of at least 16 characters "
            "(node-to-node requests are authenticated with it)",
        )
    if cluster.enabled and (config.recording.enabled or any(p.record for p in config.principals)):
        raise refuse(
            "recording.enabled" if config.recording.enabled else "cluster.store",
            "recording is not available in cluster mode yet (its index and recovery read "
            "the embedded timeline)",
        )
    ice = config.ice
    if (ice.port_min, ice.port_max) != (0, 0) and not 1 <= ice.port_min <= ice.port_max:
        raise refuse(
            "ice.port_min",
            f"the range {ice.port_min}..{ice.port_max} is neither 0/0 (any port) nor "
            "1 <= port_min <= port_max",
        )
