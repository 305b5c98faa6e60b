"""``GET /v1/webhooks``: every configured webhook, its cursor, lag and last outcome.

Rules: operators only (401 without a valid token, 403 for a publisher; in anonymous mode
every caller is an operator), checked first; then any query parameter is 400. The answer
is ``{"items": [...], "next": null}``, one item per ``[[webhooks]]`` entry in config
order (:meth:`whip.webhooks.status.WebhookStatus.describe`: in cluster mode read from the
store, so every node shows each webhook's cursor, lag and which node delivers it); the
secret never appears, and the URL is shown without its query string. A store that does not
answer is 503 (``store_unavailable``).
"""

from __future__ import annotations

from aiohttp import web

from whip.api_params import InvalidParameterError
from whip.appkeys import WEBHOOKS_KEY
from whip.auth import Role, require_caller


async def list_webhooks(request: web.Request) -> web.Response:
    """``GET /v1/webhooks`` (module rules)."""
    await require_caller(request, Role.OPERATOR)
    if request.query:
        raise InvalidParameterError("GET /v1/webhooks takes no query parameters")
    webhooks = request.app.get(WEBHOOKS_KEY, [])
    items = [await webhook.describe() for webhook in webhooks]
    return web.json_response({"items": items, "next": None})


def add_webhook_routes(app: web.Application) -> None:
    """Register ``GET /v1/webhooks``."""
    app.router.add_get("/v1/webhooks", list_webhooks, allow_head=False)
