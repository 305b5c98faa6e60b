"""The WAL record framing's hot path in C: ``encode_body`` and ``encode_frames``.

The pure-Python ``_py_encode_body`` and ``_py_encode_frames`` of :mod:`registry.record`
are the reference and the slow path: every call the fast path does not take goes to them
unchanged, so results and errors are the Python ones. The JSON is orjson's and the
CRC32C the ``crc32c`` package's, called as the reference calls them. :func:`configure`
must be called once before use; ``registry.record`` does so at import.
"""

from collections.abc import Callable, Iterable
from typing import Any

from registry.events import NewEvent

def configure(
    py_encode_body: Callable[..., bytes],
    py_encode_frames: Callable[..., bytes],
    dumps: Callable[[Any, Any, int], bytes],
    dumps_option: int,
    crc32c: Callable[[Any], int],
    /,
) -> None:
    """Set the references (and slow paths), orjson's ``dumps`` with the option the
    reference passes it, and the CRC32C callable. Until this is called, the other
    functions raise RuntimeError."""

def encode_body(event: NewEvent, max_record_bytes: int = ...) -> bytes:
    """Same bytes and errors as ``registry.record._py_encode_body``."""

def encode_frames(first_seq: int, bodies: Iterable[bytes]) -> bytes:
    """Same bytes and errors as ``registry.record._py_encode_frames``."""
