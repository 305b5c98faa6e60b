"""The WAL record codec's hot path in C: ``encode_body`` and ``encode_frames``.

Byte-identical to :mod:`registry.record`, which is the reference implementation (and the
fallback where this extension is not built). :func:`configure` must be called once
before use; ``registry.record`` does so at import.
"""

from collections.abc import Callable, Iterable
from typing import Any, Final

from registry.events import NewEvent

CRC32C_IMPL: Final[str]
"""``"sse4.2"`` or ``"table"``: which native CRC32C ``encode_frames`` uses."""

def configure(
    invalid_event_error: type[Exception],
    too_large_error: type[Exception],
    json_fallback: Callable[[Any], str],
    crc32c: Callable[[bytes, int], int],
    /,
) -> None:
    """Set the errors ``encode_body`` raises and its JSON encoder off the fast path.

    ``crc32c`` (``crc32c.crc32c``) is the reference the native CRC32C is checked
    against here; raises RuntimeError if they disagree. Until this is called, the
    other functions raise RuntimeError.
    """

def encode_body(event: NewEvent, max_record_bytes: int, /) -> bytes:
    """Same bytes and errors as ``registry.record.encode_body(event, max_record_bytes)``."""

def encode_frames(first_seq: int, bodies: Iterable[bytes | bytearray], /) -> bytes:
    """Same bytes and errors as ``registry.record.encode_frames(first_seq, bodies)``.

    Other bytes-like bodies (memoryview, array) raise TypeError.
    """

def _crc32c(data: bytes, value: int = 0, portable: bool = False, /) -> int:
    """CRC32C as ``crc32c.crc32c(data, value)``, for tests; ``portable`` forces the table
    implementation."""
