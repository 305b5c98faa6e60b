"""HTTP-facing errors of the whip package and their JSON shape.

Every domain error of the project carries its HTTP status as ``http_status`` and its
error code as ``code`` (:class:`HttpError` here; ``registry.errors.RegistryError`` and
``pipeline.errors.PipelineError`` use the same two names). Every error answer is
``{"error": {"code": ..., "message": ...}}`` and is produced in one place,
:func:`whip.middleware.error_middleware`: handlers raise, they never build an error
answer themselves.
"""

from __future__ import annotations


class HttpError(Exception):
    """A request that must be answered with ``http_status`` (client's or server's fault)."""

    http_status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        http_status: int | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if http_status is not None:
            self.http_status = http_status
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})


class NotFoundError(HttpError):
    """No such resource, or one the caller may not see (isolation: the same answer)."""

    http_status = 404
    code = "not_found"

    def __init__(self, what: str) -> None:
        super().__init__(f"no such {what}")


class NotReadyError(HttpError):
    """``/readyz``: recovery is not done or the WAL refuses appends."""

    http_status = 503
    code = "not_ready"


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON error shape of ARCHITECTURE.md."""
    return {"error": {"code": code, "message": message}}
