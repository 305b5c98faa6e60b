"""A small client of the REST API, for the CLI (``whip-ingest runs ...``, ``sessions``).

Errors from the server come back as :class:`ApiError` carrying the status and the
contract's error code; connection failures as :class:`ApiError` with status 0.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

DEFAULT_SERVER = "http://127.0.0.1:8080"


class ApiError(Exception):
    """The server answered with an error (or could not be reached: status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class Target:
    """Where the server is and how to authenticate."""

    server: str
    token: str | None

    @classmethod
    def from_args(cls, server: str | None, token: str | None) -> Target:
        """Flags win over ``WHIP_INGEST_URL`` / ``WHIP_INGEST_TOKEN``."""
        return cls(
            (server or os.environ.get("WHIP_INGEST_URL") or DEFAULT_SERVER).rstrip("/"),
            token or os.environ.get("WHIP_INGEST_TOKEN") or None,
        )

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header, if a token is set."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


class ApiClient:
    """Async calls to the REST API over one HTTP session."""

    def __init__(self, target: Target, http: aiohttp.ClientSession) -> None:
        self.target = target
        self.http = http

    async def call(self, method: str, path: str, **params: Any) -> Any:
        """One request; the decoded JSON body, or :class:`ApiError`."""
        query = {k: str(v) for k, v in params.items() if v is not None}
        try:
            async with self.http.request(
                method, self.target.server + path, params=query, headers=self.target.headers
            ) as response:
                body = await response.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {self.target.server}: {exc}") from exc
        if response.status >= 400:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            raise ApiError(
                response.status, str(error.get("code", "error")), str(error.get("message", ""))
            )
        return body

    async def runs(self, **filters: Any) -> AsyncIterator[dict[str, Any]]:
        """Every run matching ``filters``, newest first, following the cursor."""
        cursor = None
        while True:
            page = await self.call("GET", "/v1/runs", cursor=cursor, **filters)
            for item in page["items"]:
                yield item
            cursor = page.get("next")
            if not cursor:
                return

    async def events(
        self, run_id: str, after: int = 0, *, follow: bool = False, wait_s: float = 25.0
    ) -> AsyncIterator[dict[str, Any]]:
        """The run's events after ``after``; with ``follow``, long-poll for more until
        the session has closed (or the caller stops iterating)."""
        while True:
            page = await self.call(
                "GET",
                f"/v1/runs/{run_id}/events",
                after=after,
                limit=1000,
                wait=wait_s if follow else 0,
            )
            for event in page["items"]:
                yield event
                after = int(event["seq"])
                if follow and event["type"] in ("session_closed", "run_interrupted"):
                    return
            if not page["items"] and not follow:
                return
