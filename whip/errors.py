"""HTTP-facing errors of the whip package and their JSON shape.

Every error answer is ``{"error": {"code": ..., "message": ...}}`` and is produced in one
place, :func:`whip.middleware.error_middleware`.
"""

from __future__ import annotations


class HttpError(Exception):
    """A request that must be answered with ``status`` (client's or server's fault)."""

    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The JSON error shape of ARCHITECTURE.md."""
    return {"error": {"code": code, "message": message}}
