"""The server's side of cluster mode: one node of many on one PostgreSQL store.

Imported only when ``[cluster] store`` is set (it imports :mod:`registry.pg`, hence asyncpg).

Who owns what:

- The store (:class:`registry.pg.timeline.ClusterTimeline`) owns runs, events, deletion,
  stream-slot reservations and leases. This node owns only its live sessions (the session
  table) and acts on them when told.
- **Owner hooks** (:func:`attach_owner`): a control NOTIFY for a run this node owns closes
  its session with reason ``stopped``; after a LISTEN reconnect or a new lease the node
  re-reads each of its live sessions' runs and closes those the store says are stopping,
  over or deleted (a lost notification cannot leave a session running); when the lease is
  lost the node closes every session with reason ``fenced``.
- **Stream slots** (:class:`ClusterSlots`): reserved in the store (exact per principal
  across nodes). A reservation's release is awaited where the transaction can await and
  detached where it cannot; one the store never hears of is released with the node's lease.
- **Supersede** (:func:`supersede_remote`): a push to a named stream whose principal has a
  live session on it on another node asks that owner to close it (reason ``superseded``)
  and waits, bounded, until the old run is over (``reconnect = "reject"``: 409 instead).
- **Carrying** (:func:`carry_session_request`): a session DELETE or PATCH for a session this
  node does not hold is looked up in the store (its run's ``session_id`` and owner) and
  sent to the owner's ``advertise_url`` on the internal route
  ``/internal/v1/sessions/{id}``, with ``X-Whip-Cluster-Auth: <hex HMAC-SHA256 of
  method, path, principal, role and the send time (unix seconds, ``X-Whip-Cluster-Time``,
  accepted within 30 s) under cluster.secret>``; the body is not signed (use TLS between
  nodes where the network is not trusted); the owner checks it in constant time
  and answers as if the publisher had reached it (same status, headers and body). The
  internal route refuses anything else with 404 (a publisher cannot call it).
- **Carrying run requests** (:func:`carry_run_request`): a run's thumbnail lives on the node
  that owns (or owned) its session, in memory or on that node's disk. Another node checks
  the caller may see the run (another principal's run is 404 there), then carries the GET
  to the owner on ``/internal/v1/runs/{id}/thumbnail.jpg``, signed the same way; the owner
  checks the signature and the isolation again and answers from its own session or disk,
  never carrying further (no loops). An owner whose lease is gone is not asked: the
  receiving node answers from its own disk (usually 404 ``no_thumbnail``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import socket
import time
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from registry.errors import RegistryError
from registry.events import NewEvent
from registry.pg.batches import FencedError, StoreUnavailableError
from registry.pg.committer import SlotLostError
from registry.pg.timeline import ClusterTimeline, ClusterTimelineConfig, SessionOwner
from registry.runs import RunView
from whip.admission import StreamLimitError
from whip.auth import Principal, Role
from whip.config import Config
from whip.detached import DetachedTasks
from whip.errors import HttpError, NotFoundError
from whip.live_session import CloseReason

if TYPE_CHECKING:
    from whip.session_manager import SessionManager

logger = logging.getLogger(__name__)

AUTH_HEADER = "X-Whip-Cluster-Auth"
PRINCIPAL_HEADER = "X-Whip-Cluster-Principal"
ROLE_HEADER = "X-Whip-Cluster-Role"
TIME_HEADER = "X-Whip-Cluster-Time"
SIGNATURE_WINDOW_S = 30
"""A carried request signed longer ago than this (or ahead by as much) is refused: a
captured request cannot be replayed later. Node clocks must agree within it (NTP)."""
INTERNAL_PREFIX = "/internal/v1/sessions/"
INTERNAL_RUNS_PREFIX = "/internal/v1/runs/"
PUBLIC_RUNS_PREFIX = "/v1/runs/"
CARRIED_HEADERS = ("Content-Type", "If-Match", "ETag")
"""Request headers a carried session request keeps (the PATCH preconditions)."""
KEPT_HEADERS = frozenset({"Content-Type", "ETag", "Retry-After", "Cache-Control"})
"""Answer headers of the owner that the carrying node passes on."""
CARRY_TIMEOUT_S = 10.0
SUPERSEDE_WAIT_S = 5.0
OVER_STATES = frozenset({"stopping", "ended", "interrupted", "deleted"})


def node_id_of(config: Config) -> str:
    """``cluster.node_id``, or host name and port."""
    return config.cluster.node_id or f"{socket.gethostname()}-{config.server.port}"


def advertise_url_of(config: Config) -> str:
    """``cluster.advertise_url``, or ``http://host:port`` (without a trailing slash)."""
    if config.cluster.advertise_url:
        return config.cluster.advertise_url.rstrip("/")
    host = config.server.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{config.server.port}"


def cluster_timeline_config(config: Config) -> ClusterTimelineConfig:
    cluster = config.cluster
    return ClusterTimelineConfig(
        store=cluster.store,
        node_id=node_id_of(config),
        advertise_url=advertise_url_of(config),
        lease_s=cluster.lease_s,
        deleted_retention=config.wal.deleted_retention,
        stream_ttl_s=config.limits.stream_ttl_s,
    )


def unavailable(exc: RegistryError) -> HttpError:
    """A refused push while the store is out of reach or the node is fenced: 503."""
    return HttpError(str(exc), http_status=503, code=exc.code, headers={"Retry-After": "2"})


class ClusterSlot:
    """One stream-slot reservation in the store (``release`` is idempotent)."""

    def __init__(self, slots: ClusterSlots, reservation: str) -> None:
        self._slots = slots
        self.reservation = reservation
        self._released = False

    async def commit(self, created: NewEvent) -> int:
        """Append ``run_created`` consuming the reservation in the same transaction; 503
        when the reservation was released meanwhile (the node's lease epoch ended)."""
        try:
            seq = await self._slots.timeline.append(created, self.reservation)
        except (SlotLostError, FencedError) as exc:
            self._settle()
            raise unavailable(exc) from exc
        self._settle()
        return seq

    def _settle(self) -> bool:
        if self._released:
            return False
        self._released = True
        self._slots.in_flight -= 1
        return True

    def release(self) -> None:
        """Give the slot back (detached: callable where nothing can be awaited); nothing
        once :meth:`commit` consumed it."""
        if self._settle():
            self._slots.detached.detach(
                self._slots.timeline.release_slot(self.reservation), f"slot-{self.reservation}"
            )


class ClusterSlots:
    """Stream slots reserved in the store: exact per principal across the cluster."""

    def __init__(self, timeline: ClusterTimeline, limit: int, detached: DetachedTasks) -> None:
        self.timeline = timeline
        self.limit = limit
        self.detached = detached
        self.in_flight = 0

    async def reserve(self, principal: str) -> ClusterSlot:
        """A reservation, or :class:`StreamLimitError` (409); 503 when the store is out
        of reach or the node is fenced. Cancellation: a reservation made before the
        cancellation is released with the node's lease at the latest."""
        try:
            reservation = await self.timeline.reserve_slot(principal, self.limit)
        except (FencedError, StoreUnavailableError) as exc:
            raise unavailable(exc) from exc
        if reservation is None:
            raise StreamLimitError(
                f"principal {principal!r} is at its stream limit ({self.limit}) in the cluster"
            )
        self.in_flight += 1
        return ClusterSlot(self, reservation)

    def reserved(self, principal: str | None = None) -> int:
        """This node's reservations in flight (metrics)."""
        return self.in_flight


def attach_owner(timeline: ClusterTimeline, manager: SessionManager) -> None:
    """Install the owner hooks of the module doc."""

    def close_detached(run_id: str, reason: CloseReason, why: str) -> None:
        session = manager.find_by_run(run_id)
        if session is None:
            return
        logger.info("session %s run %s: closing (%s)", session.session_id, run_id, why)
        manager.detached.detach(manager.close(session, reason), f"{why}-{session.session_id}")

    def on_control(action: str, run_id: str) -> None:
        reason = CloseReason.SUPERSEDED if action == "supersede" else CloseReason.STOPPED
        close_detached(run_id, reason, f"carried {action}")

    async def on_recheck() -> None:
        for session in manager.table.live():
            try:
                view = await timeline.get_run(session.run_id)
            except (RegistryError, OSError) as exc:
                logger.warning("run %s: re-check failed: %r", session.run_id, exc)
                continue
            if view is None or view.state in OVER_STATES:
                close_detached(session.run_id, CloseReason.STOPPED, "re-check")

    async def on_fenced() -> None:
        for session in manager.table.live():
            close_detached(session.run_id, CloseReason.FENCED, "fenced")

    timeline.set_owner_hooks(on_control, on_recheck, on_fenced, lambda: len(manager.table))


async def supersede_remote(
    timeline: ClusterTimeline, principal: str, stream: str, reject: bool, within_s: float
) -> None:
    """A push to ``stream`` ends ``principal``'s live session on it on *another* node
    (``server.reconnect = "supersede"``): the owner is told, and the push waits (at most
    ``within_s``) until the old run is over, so its stream slot is free. With ``reject``
    the push is refused instead (409)."""
    from whip.session_manager import SessionSupersededConflictError

    try:
        runs = await timeline.active_stream_runs(principal, stream)
    except (FencedError, StoreUnavailableError) as exc:
        raise unavailable(exc) from exc
    for run in runs:
        if reject:
            raise SessionSupersededConflictError(
                f"stream {stream!r} already has a live session on node {run.node_id}"
            )
        await timeline.request_close(run.run_id, "supersede")
        after = run.last_seq
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while (left := deadline - loop.time()) > 0:
            batch = await timeline.wait_for_events(run.run_id, after, 100, min(left, 60.0))
            if any(e.type in ("session_closed", "run_interrupted") for e in batch):
                break
            if batch:
                after = batch[-1].seq
        logger.info(
            "run %s on node %s: superseded by a push to %r", run.run_id, run.node_id, stream
        )


# ---------------------------------------------------------------------- carrying


def carry_signature(secret: str, method: str, path: str, principal: Principal, sent_s: int) -> str:
    """The internal route's credential (module doc)."""
    message = f"{method}\n{path}\n{principal.name}\n{principal.role.value}\n{sent_s}"
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


async def carry_session_request(
    request: web.Request, timeline: ClusterTimeline, secret: str, principal: Principal, body: bytes
) -> web.Response | None:
    """Send a session request this node cannot answer to the session's owner; None when
    the store knows no such session or its owner is this node (the caller answers 404).
    A DELETE of a session whose owner node is gone is 200: the session is over."""
    session_id = request.match_info["session_id"]
    owner = await timeline.session_owner(session_id)
    if owner is None or owner.node_id == timeline.config.node_id:
        return None
    if owner.advertise_url is None:
        if request.method == "DELETE":
            return web.Response(status=200)
        raise NotFoundError("session")
    headers = {name: request.headers[name] for name in CARRIED_HEADERS if name in request.headers}
    return await send_to_owner(
        owner, request.method, f"{INTERNAL_PREFIX}{session_id}", secret, principal, body, headers
    )


async def carry_run_request(
    request: web.Request, timeline: ClusterTimeline, secret: str, principal: Principal, run: RunView
) -> web.Response | None:
    """Send a run request only the run's owner can answer (its thumbnail) to the owner,
    on ``/internal/v1/runs/{id}/...`` (the public path under the internal prefix); None
    when the owner is this node or its lease is gone (the caller answers from what it
    has). The caller checked that ``principal`` may see ``run``; the owner checks again."""
    if not run.node_id or run.node_id == timeline.config.node_id:
        return None
    url = await timeline.node_url(run.node_id)
    if url is None:
        return None
    path = INTERNAL_RUNS_PREFIX + request.path.removeprefix(PUBLIC_RUNS_PREFIX)
    owner = SessionOwner(run.node_id, url)
    return await send_to_owner(owner, request.method, path, secret, principal, b"", {})


async def send_to_owner(
    owner: SessionOwner,
    method: str,
    path: str,
    secret: str,
    principal: Principal,
    body: bytes,
    headers: dict[str, str],
) -> web.Response:
    """One signed request to ``owner`` on its internal ``path``, answered with the owner's
    status, body and :data:`KEPT_HEADERS`; 503 ``owner_unreachable`` when it does not answer
    within :data:`CARRY_TIMEOUT_S`. Cancellation: the request to the owner is abandoned."""
    assert owner.advertise_url is not None
    sent_s = int(time.time())
    signed = {
        **headers,
        AUTH_HEADER: carry_signature(secret, method, path, principal, sent_s),
        PRINCIPAL_HEADER: principal.name,
        ROLE_HEADER: principal.role.value,
        TIME_HEADER: str(sent_s),
    }
    timeout = aiohttp.ClientTimeout(total=CARRY_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as client,
            client.request(method, owner.advertise_url + path, data=body, headers=signed) as answer,
        ):
            payload = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k in KEPT_HEADERS}
            logger.info(
                "%s %s carried to node %s -> %d", method, path, owner.node_id, answer.status
            )
            return web.Response(status=answer.status, body=payload, headers=kept)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise HttpError(
            f"the owner node {owner.node_id} did not answer",
            http_status=503,
            code="owner_unreachable",
            headers={"Retry-After": "1"},
        ) from exc


def internal_principal(request: web.Request, secret: str) -> Principal:
    """The principal a carried request acts for, once its credential checks out;
    404 otherwise (the route does not exist for anyone else)."""
    name = request.headers.get(PRINCIPAL_HEADER, "")
    try:
        role = Role(request.headers.get(ROLE_HEADER, ""))
    except ValueError:
        raise NotFoundError("route") from None
    principal = Principal(name, role)
    sent = request.headers.get(TIME_HEADER, "")
    if not sent.isdigit() or abs(time.time() - int(sent)) > SIGNATURE_WINDOW_S:
        raise NotFoundError("route")
    given = request.headers.get(AUTH_HEADER, "")
    wanted = carry_signature(secret, request.method, request.path, principal, int(sent))
    if not secret or not name or not hmac.compare_digest(given.encode(), wanted.encode()):
        raise NotFoundError("route")
    return principal


async def list_nodes(request: web.Request) -> web.Response:
    """``GET /v1/nodes``: the cluster's live nodes and their leases (operators)."""
    from whip.api_params import InvalidParameterError, caller
    from whip.appkeys import CLUSTER_KEY

    who = await caller(request)
    if not who.is_operator:
        raise NotFoundError("route")
    if request.query:
        raise InvalidParameterError("GET /v1/nodes takes no query parameters")
    timeline = request.app.get(CLUSTER_KEY)
    if timeline is None:
        raise HttpError("not in cluster mode", http_status=404, code="not_clustered")
    nodes = await timeline.nodes()
    return web.json_response({"items": [node.to_json() for node in nodes], "next": None})


async def internal_session(request: web.Request) -> web.StreamResponse:
    """``DELETE``/``PATCH /internal/v1/sessions/{id}``: a session request another node
    carried here, answered as the public route answers (404 unless signed)."""
    from whip.appkeys import CONFIG_KEY
    from whip.routes_whip import serve_delete, serve_patch

    principal = internal_principal(request, request.app[CONFIG_KEY].cluster.secret)
    if request.method == "DELETE":
        return await serve_delete(request, principal)
    return await serve_patch(request, principal)


async def internal_thumbnail(request: web.Request) -> web.StreamResponse:
    """``GET /internal/v1/runs/{id}/thumbnail.jpg``: a thumbnail request another node
    carried here, answered from this node's session or disk for the carried principal
    (its isolation checked again here; 404 unless signed). Never carried further."""
    from whip.api_params import run_id_param
    from whip.appkeys import CONFIG_KEY
    from whip.routes_runs import serve_thumbnail

    principal = internal_principal(request, request.app[CONFIG_KEY].cluster.secret)
    return await serve_thumbnail(request, principal, run_id_param(request), carry=False)


def add_cluster_routes(app: web.Application) -> None:
    """``GET /v1/nodes`` and the internal routes (cluster mode only)."""
    app.router.add_get("/v1/nodes", list_nodes, allow_head=False)
    path = INTERNAL_PREFIX + "{session_id}"
    app.router.add_delete(path, internal_session)
    app.router.add_patch(path, internal_session)
    app.router.add_get(
        INTERNAL_RUNS_PREFIX + "{run_id}/thumbnail.jpg", internal_thumbnail, allow_head=False
    )
