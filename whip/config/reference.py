"""The configuration reference, generated from the schema (the README's table).

Rules:

- One row per key, in the schema's order (sections as :data:`SECTIONS` lists them, keys
  in field order), then the ``[[principals]]`` keys, then the ``[[webhooks]]`` keys
  (:data:`whip.webhooks.config.WEBHOOK_KEYS`); nothing is written by hand.
- A row shows the key's type as a reader writes it (``integer``, ``list of string``,
  ``"a" | "b"``), its default as TOML (``(required)`` or ``(optional)`` for principal
  keys), its environment variable (``-`` for principal keys: the file only) and the
  rule's description.
- :func:`render_reference` is the Markdown table between the README's
  ``config-reference`` markers; ``tests/test_readme.py`` fails when the two differ.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Literal, NamedTuple

from whip.config.layers import ENV_PREFIX
from whip.config.schema import (
    PRINCIPAL_DOCS,
    PRINCIPAL_OPTIONAL_DOCS,
    SECTIONS,
    PrincipalConfig,
    section_keys,
)
from whip.config.values import IceServer
from whip.webhooks.config import WEBHOOK_KEYS


class ConfigKey(NamedTuple):
    """One row of the configuration reference."""

    section: str
    key: str
    type: str
    default: str
    description: str

    @property
    def env(self) -> str | None:
        """The environment variable that sets this key (None: file only)."""
        if self.section in ("principals", "webhooks"):
            return None
        return f"{ENV_PREFIX}{self.section.upper()}_{self.key.upper()}"


def _type_label(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(f'"{arg}"' for arg in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"list of {_type_label(typing.get_args(tp)[0])}"
    names = {int: "integer", float: "float", bool: "boolean", str: "string", Path: "path"}
    return names.get(tp, "ICE server" if tp is IceServer else str(tp))


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def config_reference() -> list[ConfigKey]:
    """Every key: section, key, type, default (as TOML), description."""
    rows: list[ConfigKey] = []
    for section, cls in SECTIONS.items():
        for name, key in section_keys(cls).items():
            row = ConfigKey(section, name, _type_label(key.type), _toml(key.default), key.rule.doc)
            rows.append(row)
    hints = typing.get_type_hints(PrincipalConfig)
    for name, doc in PRINCIPAL_DOCS.items():
        rows.append(ConfigKey("principals", name, _type_label(hints[name]), "(required)", doc))
    for name, doc in PRINCIPAL_OPTIONAL_DOCS.items():
        rows.append(ConfigKey("principals", name, "boolean", "(optional)", doc))
    for name, (type_label, default, doc) in WEBHOOK_KEYS.items():
        rows.append(ConfigKey("webhooks", name, type_label, default, doc))
    return rows


def render_reference() -> str:
    """The reference as a Markdown table (for the README)."""
    lines = ["| key | type | default | environment | description |", "|---|---|---|---|---|"]
    for row in config_reference():
        arrays = ("principals", "webhooks")
        prefix = f"[[{row.section}]] " if row.section in arrays else f"{row.section}."
        name = prefix + row.key
        env = f"`{row.env}`" if row.env else "-"
        cells = (f"`{name}`", row.type, f"`{row.default}`", env, row.description)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
