"""Server configuration: typed, frozen, validated; one module per concept.

Rules (each module states its own in full):

- Precedence, low to high: defaults < TOML file < environment ``WHIP_INGEST_<SECTION>_<KEY>``
  < CLI flags. A list given at a higher level replaces the lower one's.
- Unknown sections, keys and ``WHIP_INGEST_*`` variables are errors; ``[[principals]]``
  exist only in the file.
- Every error is a :class:`ConfigError` naming the key and where its value came from.
- Refusal to start: no principals, JWKS or auth hook while ``server.host`` is not
  loopback; an ``[auth]`` that contradicts itself; a budget too small for one session;
  a WAL record larger than a segment; a bad ICE port range.
- Everything is pure except :func:`load_config`, which reads the one file.

Modules:

- :mod:`whip.config.schema`: the sections, keys, types, defaults, bounds; principals; the
  whole-config refusals.
- :mod:`whip.config.auth`: the ``[auth]`` section (JWT, the auth hook) and its refusals.
- :mod:`whip.config.rule`: :class:`Rule`, how a key is documented and checked.
- :mod:`whip.config.values`: checks of single values (hosts, networks, ICE URLs, specs).
- :mod:`whip.config.coerce`: a TOML value or a text as its key's type.
- :mod:`whip.config.layers`: the precedence of file, environment and flags (``build_config``).
- :mod:`whip.config.load`: reading the TOML file (``load_config``).
- :mod:`whip.config.reference`: the generated reference (the README's table).
- :mod:`whip.config.errors`: :class:`ConfigError`, and the value checks' internal error.

Callers import from ``whip.config``; the names below are the package's public surface.
"""

from whip.config.auth import AuthConfig
from whip.config.errors import ConfigError
from whip.config.layers import ENV_PREFIX, RESERVED_ENV, build_config
from whip.config.load import load_config
from whip.config.reference import ConfigKey, config_reference, render_reference
from whip.config.schema import (
    ANONYMOUS,
    ClusterConfig,
    Config,
    CorruptionPolicy,
    DecodeMode,
    GiB,
    IceConfig,
    KiB,
    LimitsConfig,
    MiB,
    PipelineConfig,
    PrincipalConfig,
    ReconnectPolicy,
    RecordingConfig,
    RecordingFormat,
    Role,
    ServerConfig,
    WalConfig,
)
from whip.config.values import IceServer, is_loopback

__all__ = [
    "ANONYMOUS",
    "ENV_PREFIX",
    "RESERVED_ENV",
    "AuthConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConfigKey",
    "CorruptionPolicy",
    "DecodeMode",
    "GiB",
    "IceConfig",
    "IceServer",
    "KiB",
    "LimitsConfig",
    "MiB",
    "PipelineConfig",
    "PrincipalConfig",
    "ReconnectPolicy",
    "RecordingConfig",
    "RecordingFormat",
    "Role",
    "ServerConfig",
    "WalConfig",
    "build_config",
    "config_reference",
    "is_loopback",
    "load_config",
    "render_reference",
]
