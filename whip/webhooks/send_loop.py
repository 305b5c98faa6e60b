"""One event sent until its receiver accepts it: the attempt and retry loop and the
record of outcomes that both deliverers share (the embedded
:class:`~whip.webhooks.dispatcher.WebhookDispatcher` and the cluster's
:class:`~whip.webhooks.cluster_delivery.ClusterWebhookDelivery`).

:class:`SendLoop` is their base. Per event: sign (the same ``webhook-id`` on every try, a
fresh ``webhook-timestamp`` each), ask the deliverer whether it may still send (its check
raises to stop, and returns what its 410 step needs: the cluster's delivery lease), make
one attempt (the deliverer's way: the attempt child, or an HTTP client), record it, and
on a 2xx return; a 410 goes to the deliverer's ``gone`` step, which makes the disable
durable its own way and raises; any other failure waits :func:`retry_delay` (exponential
with jitter) and tries again. The run's in-flight mark (``_in_delivery``, the lag's
"oldest in delivery") is held for the whole loop.

Event loop only; the record's fields are plain values read from any thread by the
deliverers' ``status``. Cancellation: the attempt in flight is abandoned (the event is
sent again later: at least once).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import NoReturn

from registry.events import Event
from whip.webhooks.config import WebhookConfig
from whip.webhooks.delivery import Attempt, retry_delay
from whip.webhooks.signing import headers, message_body, message_id

logger = logging.getLogger(__name__)

SendOnce = Callable[[bytes, dict[str, str]], Awaitable[Attempt]]
"""One attempt of a signed body: ``send_once(body, signed_headers)``."""


class SendLoop:
    """The attempt loop and the outcome record of one webhook (module doc)."""

    webhook: WebhookConfig
    _rng: random.Random

    def _init_send_loop(self) -> None:
        self._in_delivery: dict[str, int] = {}
        """Run id -> ts_ms of the event in delivery (one per run: runs go in order)."""
        self.outcomes: Counter[str] = Counter()
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.last_attempt_ms: int | None = None
        self.last_success_ms: int | None = None

    async def _send_until_accepted[T](
        self,
        event: Event,
        may_send: Callable[[], T],
        send_once: SendOnce,
        gone: Callable[[Event, T], Awaitable[NoReturn]],
        msg_id: str | None = None,
    ) -> None:
        """Send ``event`` until a 2xx (module doc). ``may_send`` raises to stop before each
        attempt; ``gone`` gets what it returned for the attempt a 410 answered. ``msg_id``:
        the ``webhook-id`` when the deliverer knows more than the event (the cluster's
        incarnation), else :func:`~whip.webhooks.signing.message_id` of the event."""
        body = message_body(event)
        if msg_id is None:
            msg_id = message_id(event)
        failures = 0
        self._in_delivery[event.run_id] = event.ts_ms
        try:
            while True:
                token = may_send()
                signed = headers(self.webhook.secret_key, msg_id, int(time.time()), body)
                result = await send_once(body, signed)
                self._record(result, event, failures + 1)
                if result.ok:
                    return
                if result.outcome == "gone":
                    await gone(event, token)
                failures += 1
                await asyncio.sleep(
                    retry_delay(
                        failures, self.webhook.retry_min_s, self.webhook.retry_max_s, self._rng
                    )
                )
        finally:
            self._in_delivery.pop(event.run_id, None)

    def _record(self, result: Attempt, event: Event, number: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        self.outcomes[result.outcome] += 1
        self.last_status = result.status
        self.last_attempt_ms = now_ms
        name = self.webhook.name
        if result.ok:
            self.last_success_ms = now_ms
            self.last_error = None
            if number > 1:
                logger.info(
                    "webhook %s: run %s seq %d delivered after %d attempts",
                    name,
                    event.run_id,
                    event.seq,
                    number,
                )
            return
        self.last_error = result.error
        log = logger.warning if number == 1 or number % 10 == 0 else logger.debug
        log(
            "webhook %s: run %s seq %d attempt %d failed (%s): %s",
            name,
            event.run_id,
            event.seq,
            number,
            result.outcome,
            result.error,
        )
