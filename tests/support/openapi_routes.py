"""Operations of ``whip/openapi.json`` against the routes an app really serves.

The document describes every public route of both modes; :data:`CLUSTER_ONLY` are the
operations only a cluster-mode app routes (an embedded app may leave them unrouted), and
the ``/internal/`` routes of cluster mode are node-to-node, never documented
(:func:`public_operations` leaves them out).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
CLUSTER_ONLY = frozenset({("GET", "/v1/nodes")})
"""Documented operations routed only in cluster mode."""


def documented_operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """``(METHOD, path template)`` of every operation in the document."""
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def routed_operations(app: web.Application) -> set[tuple[str, str]]:
    """``(METHOD, path template)`` of every route of ``app``."""
    routed = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert path, f"route without a path: {route}"
        routed.add((route.method, path))
    return routed


def public_operations(app: web.Application) -> set[tuple[str, str]]:
    """:func:`routed_operations` without the node-to-node ``/internal/`` routes."""
    return {op for op in routed_operations(app) if not op[1].startswith("/internal/")}
