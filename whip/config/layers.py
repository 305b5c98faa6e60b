"""Layering: defaults < TOML file < environment < flags, each value with its source.

Rules:

- Precedence, low to high: the schema's defaults < the TOML document < environment
  variables ``WHIP_INGEST_<SECTION>_<KEY>`` (``WHIP_INGEST_LIMITS_MAX_SESSIONS=50``) <
  overrides (CLI flags, keyed ``"<section>.<key>"``; ``None`` means "flag not given").
  A higher layer's value replaces the lower one's whole: lists are never merged.
- Environment values and string overrides are text (:func:`whip.config.coerce.coerce`);
  TOML values and overrides of another type must already have the key's type.
- Unknown sections, keys and ``WHIP_INGEST_*`` variables are errors, except the names in
  :data:`RESERVED_ENV`, which belong to the CLI. ``[[principals]]`` and ``[[webhooks]]``
  exist only in the file: a ``WHIP_INGEST_PRINCIPALS_*`` or ``WHIP_INGEST_WEBHOOKS_*``
  variable is an error.
- Every value is checked as it enters (the file, the environment, the flags, then the
  principals), so the first bad one is reported, as a
  :class:`ConfigError` naming the key and its source (``config file PATH``, ``environment
  NAME``, ``flag section.key``); whole-config refusals name the source of the blamed key.
- Environment variables are applied in sorted name order, overrides in the caller's order.
- Pure: the document is already parsed and the environment is a mapping passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

from whip.config.checks import check_whole, parse_principals, parse_webhook_entries
from whip.config.coerce import coerce
from whip.config.errors import ConfigError, InvalidValue
from whip.config.schema import SECTIONS, Config, check_rule, section_keys

ENV_PREFIX = "WHIP_INGEST_"
RESERVED_ENV = frozenset({"WHIP_INGEST_CONFIG", "WHIP_INGEST_LOG_LEVEL"})
FILE_ONLY = frozenset({"principals", "webhooks"})
"""Arrays of tables that only the file configures."""


class Layers:
    """Validated values per section and key, with the source each came from."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, object]] = {name: {} for name in SECTIONS}
        self.sources: dict[str, str] = {}

    def set(self, section: str, key: str, raw: object, source: str, text: bool) -> None:
        """Check ``raw`` against the key's type and rule and keep it, replacing any value
        from a lower layer; ``text``: ``raw`` is parsed from a string."""
        if section not in SECTIONS:
            known = ", ".join(SECTIONS)
            raise ConfigError(
                f"{source}: unknown section {section!r} (known: {known})",
                key=section,
                source=source,
            )
        keys = section_keys(SECTIONS[section])
        dotted = f"{section}.{key}"
        if key not in keys:
            known = ", ".join(keys)
            raise ConfigError(
                f"{source}: unknown key {dotted!r} (known: {known})", key=dotted, source=source
            )
        try:
            value = coerce(raw, keys[key].type, text)
            check_rule(value, keys[key].rule)
        except InvalidValue as exc:
            raise ConfigError(f"{dotted} ({source}): {exc}", key=dotted, source=source) from None
        self.values[section][key] = value
        self.sources[dotted] = source

    def source(self, dotted: str) -> str:
        """Where ``section.key``'s value came from: a source label, or ``"default"``."""
        return self.sources.get(dotted, "default")


def build_config(
    document: Mapping[str, object],
    env: Mapping[str, str],
    overrides: Mapping[str, object],
    *,
    file_label: str = "config file",
) -> Config:
    """Layer ``document`` (parsed TOML), ``env`` and ``overrides`` (the module's rules)."""
    layers = Layers()
    for section, body in document.items():
        if section in FILE_ONLY:
            continue
        if not isinstance(body, dict):
            raise ConfigError(
                f"{file_label}: [{section}] must be a table", key=section, source=file_label
            )
        for key, raw in body.items():
            layers.set(section, key, raw, file_label, text=False)
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        section, _, key = name.removeprefix(ENV_PREFIX).lower().partition("_")
        source = f"environment {name}"
        if section in FILE_ONLY:
            raise ConfigError(
                f"{source}: {section} are configured in the file only",
                key=section,
                source=source,
            )
        layers.set(section, key, env[name], source, text=True)
    for dotted, raw in overrides.items():
        if raw is not None:
            section, _, key = dotted.partition(".")
            layers.set(section, key, raw, f"flag {dotted}", text=isinstance(raw, str))
    principals = parse_principals(document.get("principals", []), file_label)
    webhooks = parse_webhook_entries(document.get("webhooks", []), file_label)
    sections = {name: cls(**layers.values[name]) for name, cls in SECTIONS.items()}
    config = Config(**sections, principals=principals, webhooks=webhooks)
    check_whole(config, layers.source)
    return config
