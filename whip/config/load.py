"""Loading: the TOML file read from disk, then layered (:func:`whip.config.build_config`).

Rules:

- The only part of the package that does I/O: one small file, read whole, blocking. Call
  :func:`load_config` before the event loop starts.
- No path means no file (defaults, environment and flags only); a path that cannot be
  read, or is not UTF-8 TOML, is a :class:`ConfigError` with the OS's or the parser's
  reason, its source ``config file PATH``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whip.config.errors import ConfigError
from whip.config.layers import build_config
from whip.config.schema import Config


def load_config(
    path: Path | None, env: Mapping[str, str], overrides: Mapping[str, object]
) -> Config:
    """Read the TOML file at ``path`` (None: no file) and :func:`build_config`.

    Blocking (reads one small file): call it before the event loop starts.
    """
    label = f"config file {path}"
    document: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{label}: cannot read: {exc.strerror}", source=label) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{label}: not valid TOML: {exc}", source=label) from exc
    return build_config(document, env, overrides, file_label=label)
