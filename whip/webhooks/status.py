"""What every webhook deliverer shows, whichever store keeps its cursor.

Rules: the embedded dispatcher (:class:`whip.webhooks.dispatcher.WebhookDispatcher`) and
the cluster deliverer (:class:`whip.webhooks.cluster_delivery.ClusterWebhookDeliverer`)
both answer these. :meth:`WebhookStatus.status` and :attr:`WebhookStatus.lag_events` are
cheap and readable from any thread (the metrics collector reads them at scrape time);
:meth:`WebhookStatus.describe` is the ``GET /v1/webhooks`` item, awaited on the server's
loop (the cluster deliverer asks the store there, so any node shows the same).
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class WebhookStatus(Protocol):
    """One configured webhook as the routes and the metrics see it."""

    @property
    def name(self) -> str: ...

    @property
    def outcomes(self) -> Counter[str]:
        """Attempts by outcome (:data:`whip.webhooks.delivery.OUTCOMES`)."""
        ...

    @property
    def lag_events(self) -> int: ...

    def status(self) -> dict[str, object]:
        """The last known item (no I/O)."""
        ...

    async def describe(self) -> dict[str, object]:
        """The current item (may ask the store). Cancellation: nothing changes."""
        ...
