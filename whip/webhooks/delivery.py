"""One HTTP delivery attempt, bounded in every way a receiver could stretch it, and the
retry delays between attempts.

Rules:

- Success is any 2xx. 410 Gone is its own outcome (the dispatcher disables the
  webhook). Everything else is a failure that is retried: another status, a 3xx (never
  followed: a redirect could point the signed events anywhere), a timeout, a connection
  or protocol error.
- Bounded: the whole attempt (connect, send, status, headers, body) is cut at the
  webhook's ``timeout_s``, so a receiver that never answers or never ends its body costs
  at most that. At most :data:`MAX_RESPONSE_BYTES` of the body are read (the first ones
  become the error text of a failure); a longer body is not drained: the connection is
  closed. Bodies are not decompressed. The client is :mod:`whip.webhooks.http_client`
  (keep-alive connections, at most the webhook's ``max_parallel_runs``).
- Outcomes are a closed set (:data:`OUTCOMES`): they label the delivery counter.
- Retry delays (:func:`retry_delay`): the n-th consecutive failure waits ``retry_min_s *
  2**(n-1)``, capped at ``retry_max_s``, jittered down by up to half, never below
  ``retry_min_s``.
- :func:`shown_url` is the one form of a webhook URL that logs and the API show: no
  query string (it may carry a receiver's token); an error text that quotes the URL
  quotes it in that form.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

from whip.webhooks.http_client import HttpClient

MAX_RESPONSE_BYTES: Final = 16 * 1024
ERROR_TEXT_CHARS: Final = 200

Outcome = Literal["success", "gone", "failed", "redirect", "timeout", "error"]
OUTCOMES: tuple[Outcome, ...] = ("success", "gone", "failed", "redirect", "timeout", "error")


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt came to: its outcome, the HTTP status if one came, an error text."""

    outcome: Outcome
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


def shown_url(url: str) -> str:
    """``url`` without its query and fragment (module rules)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def new_http_session(parallel: int) -> HttpClient:
    """A webhook's own HTTP client: at most ``parallel`` connections, no cookies, no
    proxies, no decompression, no redirects followed."""
    return HttpClient(parallel)


async def attempt(
    http: HttpClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
) -> Attempt:
    """POST ``body`` once (module rules). Never raises for what the receiver does.

    Cancellation: the request is abandoned and its connection closed.
    """
    try:
        async with asyncio.timeout(timeout_s):
            answer = await http.post(url, body, headers, MAX_RESPONSE_BYTES)
    except TimeoutError:
        return Attempt("timeout", error=f"no complete answer within {timeout_s:g} s")
    except (OSError, ValueError) as exc:
        detail = f"{type(exc).__name__}: {exc}".replace(url, shown_url(url))
        return Attempt("error", error=detail[:ERROR_TEXT_CHARS])
    status = answer.status
    if 200 <= status < 300:
        return Attempt("success", status)
    if status == 410:
        return Attempt("gone", status, "410 Gone: the receiver asked to be disabled")
    if 300 <= status < 400:
        return Attempt("redirect", status, f"{status} redirect not followed")
    snippet = answer.body[:ERROR_TEXT_CHARS].decode("utf-8", "replace")
    return Attempt("failed", status, f"HTTP {status}: {snippet}" if snippet else f"HTTP {status}")


def retry_delay(failures: int, min_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds to wait after the ``failures``-th consecutive failure (module rules)."""
    base = min(max_s, min_s * 2.0 ** min(failures - 1, 60))
    return max(min_s, base * (0.5 + 0.5 * rng.random()))
