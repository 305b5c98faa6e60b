"""The registry's exception tree.

Errors split by who is at fault (h11 style):

- :class:`BadRequestError` subclasses: the caller asked for something invalid (a remote
  fault when the caller is an HTTP client). Each carries the HTTP status it maps to.
- :class:`TimelineClosedError`: *we* closed the timeline; appends after close are refused.
- :class:`TimelineBrokenError`: the log broke under us (write or fsync failed); the
  original ``OSError`` is chained as ``__cause__``.
- :class:`DataDirLockedError`, :class:`CorruptLogError`: the data directory cannot be
  opened safely.
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base of every error raised by the registry package."""

    http_status = 500
    code = "internal"


class BadRequestError(RegistryError):
    """The caller asked for something invalid."""

    http_status = 400
    code = "bad_request"


class InvalidCursorError(BadRequestError):
    """A negative, non-integer or out-of-range ``after``/``limit``/``wait``."""

    code = "invalid_cursor"


class EventTooLargeError(BadRequestError):
    """The encoded event exceeds the configured maximum record size."""

    http_status = 413
    code = "event_too_large"


class InvalidEventError(BadRequestError):
    """An event that cannot be stored (empty run id, unserializable data, ...)."""

    code = "invalid_event"


class UnknownRunError(RegistryError):
    """The run id was never seen (or was evicted from deleted-run retention)."""

    http_status = 404
    code = "unknown_run"


class NonBlockingDeleteError(BadRequestError):
    """``run_deleted`` was offered to ``append_nowait``: deletion is always confirmed."""

    code = "delete_must_be_confirmed"


class QueueFullError(RegistryError):
    """``append_nowait`` found the writer's bounded queue full; nothing was queued."""

    http_status = 503
    code = "wal_queue_full"


class TimelineClosedError(RegistryError):
    """We closed the timeline: no more appends are accepted."""

    http_status = 503
    code = "timeline_closed"


class TimelineBrokenError(RegistryError):
    """The log broke under us (a failed write or fsync). The OS error is the cause."""

    http_status = 500
    code = "timeline_broken"


class AppendFailedError(RegistryError):
    """One batch failed to become durable and was rolled back; the log is still usable."""

    http_status = 500
    code = "append_failed"


class DataDirLockedError(RegistryError):
    """Another process holds the data directory's lock file."""

    code = "data_dir_locked"


class CorruptLogError(RegistryError):
    """A record in the middle of the log failed its checksum (not a torn tail).

    ``segment`` and ``offset`` say where; ``last_good_seq`` is the last intact record.
    """

    code = "corrupt_log"

    def __init__(self, message: str, *, segment: str, offset: int, last_good_seq: int) -> None:
        super().__init__(message)
        self.segment = segment
        self.offset = offset
        self.last_good_seq = last_good_seq
