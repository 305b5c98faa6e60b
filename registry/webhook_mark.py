"""What a receiver's 410 Gone leaves behind: the durable mark that disables a webhook.

Rules: one definition for both cursor stores (the data dir's cursor file,
:mod:`whip.webhooks.cursor`, and the cluster store, :mod:`registry.pg.webhook_store`). The
mark names the URL that answered 410; it disables the webhook only while the configured URL
is that URL, so configuring another URL for the name re-enables it (its cursor kept).
Pure data: nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DisabledMark:
    """A receiver answered 410 Gone: the URL it was, when (ms since the epoch), and why."""

    url: str
    at_ms: int
    reason: str

    def applies_to(self, url: str) -> bool:
        """Whether the mark still disables a webhook configured with ``url``."""
        return self.url == url

    def to_json(self, shown_url: str) -> dict[str, object]:
        """The ``disabled`` field of ``GET /v1/webhooks`` (the URL as the caller shows it)."""
        return {"url": shown_url, "at_ms": self.at_ms, "reason": self.reason}
