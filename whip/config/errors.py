"""The configuration's two errors.

Rules:

- :class:`ConfigError` is the only error that leaves the package: a configuration that
  must not be started. Its message names the key and where the value came from (the
  file, an environment variable, a flag); ``key`` and ``source`` say the same for code.
- :class:`InvalidValue` is raised by the value checks, which do not know the key or the
  source; the layering turns it into a :class:`ConfigError` that does. It never escapes.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that must not be started. ``key`` and ``source`` say where."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None):
        super().__init__(message)
        self.key = key
        self.source = source


class InvalidValue(ValueError):
    """A value problem, before it is known which key and source it belongs to."""
