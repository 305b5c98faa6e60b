"""Real cluster node processes on one PostgreSQL, for tests: :class:`Cluster` starts
``python -m whip serve`` processes (:class:`bench.support.server_process.ServerProcess`, PIDs
recorded, only they are ever signalled) in cluster mode on one database, lease 4 s,
anonymous mode on loopback, ``stream_limit`` 4 (and 4 sessions per node), the connect
deadline raised past a module's life (a 201 needs the answer, not a connected peer); the
readiness wait for a loaded machine; and the REST helpers the cluster tests share.
``Cluster.env`` adds variables to every node (a config file: ``WHIP_INGEST_CONFIG``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import aiohttp

from bench.support.server_process import ServerProcess, wait_ready

LEASE_S = 4.0
STREAM_LIMIT = 4
SECRET = "a-test-cluster-secret"
NODE_IDS = ("n0", "n1", "n2")
START_WITHIN_S = 120.0


@dataclass
class Cluster:
    store: str
    root: Path
    nodes: dict[str, ServerProcess]
    offer: str
    env: dict[str, str] = field(default_factory=dict)
    """More variables for every node (module doc)."""

    def node_env(self, node_id: str) -> dict[str, str]:
        return {
            "WHIP_INGEST_CLUSTER_STORE": self.store,
            "WHIP_INGEST_CLUSTER_NODE_ID": node_id,
            "WHIP_INGEST_CLUSTER_LEASE_S": str(LEASE_S),
            "WHIP_INGEST_CLUSTER_SECRET": SECRET,
            "WHIP_INGEST_LIMITS_CONNECT_TIMEOUT_S": "300",
            **self.env,
        }

    def start(self, node_id: str) -> ServerProcess:
        proc = ServerProcess(
            f"cluster-{node_id}",
            self.root / node_id,
            self.root / f"{node_id}-{len(os.listdir(self.root))}.log",
            STREAM_LIMIT,
            self.node_env(node_id),
        )
        self.nodes[node_id] = proc
        return proc

    def base(self, index: int) -> str:
        return self.nodes[NODE_IDS[index]].base

    def problems(self) -> str:
        """The warnings and errors in every node's log (for a failure's message)."""
        lines = []
        for node_id, proc in self.nodes.items():
            if not proc.log_path.exists():
                continue
            logged = proc.log_path.read_text(errors="replace").splitlines()
            noted = [line for line in logged if " WARNING " in line or " ERROR " in line]
            lines += [f"{node_id}: {line}" for line in noted[-20:]]
        return "\n".join(lines) or "(no warning or error in the node logs)"


async def ready(proc: ServerProcess) -> None:
    """Readiness of a node process; a start-up bound for a loaded machine (an import of
    the server takes 2 s of CPU, and 20 s of wall time at a load of 14 on 2 cores)."""
    await wait_ready(proc.base, proc.proc.poll, START_WITHIN_S)


class Posted(NamedTuple):
    status: int
    location: str
    run_id: str
    code: str
    """The error code of a refusal ("" for a 201)."""


async def post(http: aiohttp.ClientSession, url: str, offer: str) -> Posted:
    async with http.post(url, data=offer, headers={"Content-Type": "application/sdp"}) as answer:
        code = ""
        if answer.status != 201:
            code = (await answer.json())["error"]["code"]
        return Posted(
            answer.status,
            answer.headers.get("Location", ""),
            answer.headers.get("X-Run-Id", ""),
            code,
        )


async def created(http: aiohttp.ClientSession, url: str, cluster: Cluster) -> Posted:
    """A POST that must be accepted (the refusal and the node logs otherwise)."""
    answer = await post(http, url, cluster.offer)
    assert answer.status == 201, f"{answer}\n{cluster.problems()}"
    return answer


async def events(http: aiohttp.ClientSession, base: str, run_id: str) -> list[dict[str, object]]:
    async with http.get(f"{base}/v1/runs/{run_id}/events", params={"limit": "1000"}) as answer:
        assert answer.status == 200, await answer.text()
        items: list[dict[str, object]] = (await answer.json())["items"]
        return items


def of_type(items: list[dict[str, object]], etype: str) -> list[dict[str, object]]:
    return [item for item in items if item["type"] == etype]


async def active_runs(http: aiohttp.ClientSession, base: str) -> list[str]:
    async with http.get(f"{base}/v1/runs", params={"limit": "1000"}) as answer:
        runs = (await answer.json())["items"]
    return [r["id"] for r in runs if r["state"] in ("starting", "live", "stopping")]
