"""A raw value as the type of its key: how TOML values and text (environment, flags) are read.

Rules:

- TOML values must already have the key's type (a path is a string); the one widening is
  an integer for a float. Booleans are never numbers (``true`` is not ``1``).
- Text (``text=True``: environment variables, string flags) is stripped, then parsed by the
  key's type: integers (up to 19 digits, optional sign), finite floats, booleans
  (``true/false/1/0/yes/no/on/off``, any case), paths (not empty), strings as stripped.
- A list is a TOML array or, as text, comma-separated items (empty items skipped); each
  item is read as the list's item type.
- A ``Literal`` key takes exactly one of its strings (case-sensitive).
- An ICE server is a URL string or a TOML table ``{url, username, credential}`` (strings).
- Floats must be finite: ``nan`` and ``inf`` are refused, from TOML and from text.
- Every refusal is :class:`InvalidValue` saying what was expected and what came.
"""

from __future__ import annotations

import math
import re
import typing
from pathlib import Path
from typing import Any, Literal

from whip.config.errors import InvalidValue
from whip.config.values import IceServer

_BOOLS = {"true": True, "1": True, "yes": True, "on": True}
_BOOLS |= {"false": False, "0": False, "no": False, "off": False}
_NAMES: dict[Any, str] = {bool: "a boolean", int: "an integer", float: "a number", Path: "a path"}


def _type_name(value: object) -> str:
    return _NAMES.get(type(value), "a string" if isinstance(value, str) else "a table or list")


def coerce(value: object, tp: Any, text: bool) -> object:
    """``value`` as type ``tp``; ``text``: strings are parsed (environment, flags)."""
    args = typing.get_args(tp)
    if text and isinstance(value, str):
        value = value.strip()
    if typing.get_origin(tp) is Literal:
        if value not in args:
            raise InvalidValue(f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if typing.get_origin(tp) is tuple:
        if text and isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list | tuple):
            raise InvalidValue(f"must be a list, got {_type_name(value)}")
        return tuple(coerce(item, args[0], text) for item in value)
    if tp is IceServer:
        return _ice_server(value)
    if text and isinstance(value, str) and tp is not str:
        return _parse_text(value, tp)
    if tp is Path and isinstance(value, str | Path) and str(value):
        return Path(value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise InvalidValue(f"must be a finite number, got {value!r}")
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    raise InvalidValue(f"must be {_NAMES.get(tp, 'a string')}, got {_type_name(value)} {value!r}")


def _parse_text(value: str, tp: Any) -> object:
    if tp is bool and value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    if tp is int and re.fullmatch(r"[+-]?\d{1,19}", value):
        return int(value)
    if tp is float and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", value):
        return coerce(float(value), float, False)
    if tp is Path and value:
        return Path(value)
    raise InvalidValue(f"must be {_NAMES[tp]}, got {value!r}")


def _ice_server(value: object) -> IceServer:
    if isinstance(value, IceServer):
        return value
    if isinstance(value, str):
        return IceServer(value)
    if isinstance(value, dict):
        unknown = set(value) - {"url", "username", "credential"}
        if unknown or not all(isinstance(v, str) for v in value.values()):
            raise InvalidValue("an ICE server table has string keys url, username, credential")
        if "url" not in value:
            raise InvalidValue("an ICE server table needs a url")
        return IceServer(value["url"], value.get("username"), value.get("credential"))
    raise InvalidValue(f"an ICE server is a URL or a table, got {_type_name(value)}")
