"""Webhooks from the durable timeline (Standard Webhooks signatures), one concept a module.

- :mod:`whip.webhooks.config`: the ``[[webhooks]]`` entries and their checks (pure).
- :mod:`whip.webhooks.signing`: message id, body and signature of a delivery (pure).
- :mod:`whip.webhooks.cursor`: what a webhook's cursor is (the ledger, pure) and where it
  is kept (:class:`~whip.webhooks.cursor.CursorStore`; the data dir's group-committed
  file).
- :mod:`whip.webhooks.delivery`: one HTTP attempt, bounded, and the retry delays.
- :mod:`whip.webhooks.followed_log`: the log a dispatcher reads (the protocol), and the
  delivery process's view of the WAL.
- :mod:`whip.webhooks.dispatcher`: one webhook's delivery loop: follows the log, in order
  per run, runs in parallel up to a bound.
- :mod:`whip.webhooks.group`: the dispatchers of one loop, their feed subscription and
  their close.
- :mod:`whip.webhooks.delivery_process`: the embedded webhooks' child process, which
  follows the WAL itself and runs every dispatcher, and the server's side of it.
- :mod:`whip.webhooks.delivery_thread`: cluster mode's thread and event loop for its
  deliverers (never the server's loop).
- :mod:`whip.webhooks.child_pipes`: how both child processes are started, and their frames.
- :mod:`whip.webhooks.attempt_process`: the child process cluster mode's HTTP attempts
  are made in (the HTTP client off the server's GIL).
- :mod:`whip.webhooks.cluster_delivery`: cluster mode's deliverer: the cursors and the
  delivery lease in the store (:mod:`registry.pg.webhook_store`), one node at a time.
- :mod:`whip.webhooks.cluster_service`: cluster mode's deliverers on the delivery thread,
  their pool and their LISTEN wake-ups.
- :mod:`whip.webhooks.status`: what both kinds of deliverer show (routes, metrics).
- :mod:`whip.webhooks.service`: every webhook of the app, its startup and cleanup, the
  metrics collector.
- :mod:`whip.webhooks.routes`: ``GET /v1/webhooks`` (operators).

Import direction: this package imports :mod:`registry` and :mod:`whip` leaf modules; the
config package imports only :mod:`whip.webhooks.config` (which imports nothing of ours).
"""
