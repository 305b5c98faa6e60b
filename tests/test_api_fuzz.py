"""Schema-driven fuzzing of the whole HTTP surface with schemathesis.

Every operation of ``whip/openapi.json`` (WHIP, REST, health, metrics) gets generated
requests, valid and invalid (schemathesis' positive and negative modes), against the
live server on 127.0.0.1. Schemathesis sends an operator's bearer token where the
document asks for one (``auth.openapi``) and leaves it out in some negative cases, which
must then be 401. Each answer must:

- not be a 5xx;
- use a documented status code, content type and headers, and match the documented
  schema (so the document and the server agree);
- reject invalid input with a 4xx (``negative_data_rejection``);
- accept valid input on the REST routes (``positive_data_acceptance``; 404/409 count as
  accepted). WHIP bodies and list cursors are excluded from that check: a string can be
  valid for the schema and still not be an SDP offer or a cursor the server issued.

Operations on a run id run twice: with generated ids (almost all unknown) and with the id
of a seeded run, so event reads, long-polls, stops and deletes reach real runs; the
session id of a real live publisher is used the same way. ``wait`` is capped at 50 ms
so long-polls cannot stretch the run. Example counts are bounded (``EXAMPLES`` per
operation and mode); the test asserts and prints how many cases it ran.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import schemathesis
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from registry.events import NewEvent
from tests.support.peers import AiortcPublisher
from tests.support.servers import make_config
from whip.app import create_app
from whip.appkeys import TIMELINE_KEY
from whip.auth import hash_token
from whip.cli import configure_ice

pytestmark = pytest.mark.filterwarnings(
    # schemathesis' own strategies draw from `random`; newer Hypothesis deprecates that.
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning"
)

OPENAPI = Path(__file__).parent.parent / "whip" / "openapi.json"
EXAMPLES = 20
"""Hypothesis examples per (operation, mode, fixed-or-generated ids)."""
MAX_WAIT = 0.05
OPERATOR = "fuzz-operator-token"
PRINCIPALS = [
    {"name": "ops", "role": "operator", "token_sha256": hash_token(OPERATOR)},
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token("fuzz-publisher")},
]


# SDP offers and trickle fragments are text: send them as text/plain bodies are sent.
schemathesis.serializer.alias(["application/sdp", "application/trickle-ice-sdpfrag"], "text/plain")


def _accepting(ctx: Any, response: Any, case: Any) -> bool | None:
    """``positive_data_acceptance``, except where a schema-valid string can still be
    wrong by content (an SDP offer, a trickle fragment, a list cursor)."""
    if case.operation.path.startswith("/whip") or "cursor" in (case.query or {}):
        return None
    return positive_data_acceptance(ctx, response, case)


CHECKS: list[Callable[..., Any]] = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def _load_schema() -> Any:
    config = schemathesis.Config.from_dict(
        {
            "auth": {"openapi": {"bearer": {"bearer": OPERATOR}}},
            "checks": {
                "negative_data_rejection": {
                    "expected-statuses": [400, 401, 403, 404, 405, 409, 413, 415, 422]
                },
                "positive_data_acceptance": {"expected-statuses": ["2xx", 404, 409]},
            },
        }
    )
    return schemathesis.openapi.from_dict(json.loads(OPENAPI.read_text()), config=config)


def _fuzz(base_url: str, fixed_ids: dict[str, str], routed: set[tuple[str, str]]) -> Counter[str]:
    """Run every operation; returns case counts by status class (blocking: a thread)."""
    schema = _load_schema()
    counts: Counter[str] = Counter()
    failures: list[str] = []
    http = requests.Session()

    def run(operation: Any, mode: GenerationMode, path_parameters: dict[str, str] | None) -> None:
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def one(case: Any) -> None:
            query = case.query
            wait = query.get("wait") if isinstance(query, dict) else None
            if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait <= 60:
                query["wait"] = min(wait, MAX_WAIT)
            response = case.call(base_url=base_url, session=http)
            counts[str(response.status_code)] += 1
            if response.status_code >= 500:
                failures.append(f"{operation.label}: {response.status_code} {response.text[:200]}")
            try:
                case.validate_response(
                    response,
                    checks=CHECKS,
                    additional_checks=[_accepting],
                )
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
                failures.append(f"{operation.label} [{mode.value}]: {exc}"[:3000])

        try:
            one()
        except Unsatisfiable:
            # Negative mode on an operation with nothing to make invalid (no params, no body).
            assert mode.is_negative, operation.label
            counts["nothing to negate"] += 1

    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) not in routed:
            continue  # documented ahead of its handler (test_api checks the list)
        names = {p.name for p in operation.path_parameters}
        fixed = {name: fixed_ids[name] for name in names if name in fixed_ids}
        if operation.path.startswith("/whip"):
            fixed = {}  # a WHIP DELETE of the live session would end it for the rest
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run(operation, mode, None)
            if fixed:
                run(operation, mode, fixed)
    assert not failures, "\n\n".join(failures[:10]) + f"\n\n({len(failures)} failures)"
    return counts


def _routed(server: TestServer) -> set[tuple[str, str]]:
    routed = set()
    for route in server.app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        routed.add((route.method, str(info.get("path") or info.get("formatter"))))
    return routed


@pytest.mark.timeout(180)
async def test_schemathesis_whole_surface_no_5xx_and_conforms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, PRINCIPALS, limits__stream_limit=100)
    configure_ice(config)
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    publisher = AiortcPublisher()
    try:
        timeline = server.app[TIMELINE_KEY]
        await timeline.append(
            NewEvent("r_fuzzseededrun000000001", "run_created", "ops", {"stream": "cam"})
        )
        for n in range(5):
            await timeline.append(NewEvent("r_fuzzseededrun000000001", "stats", "ops", {"n": n}))
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(
                http,
                str(server.make_url("/whip/fuzz-cam")),
                {"Authorization": f"Bearer {OPERATOR}"},
            )
            assert response.status == 201
        await asyncio.wait_for(publisher.connected.wait(), 20)
        session_id = publisher.location.rsplit("/", 1)[1]
        assert re.fullmatch(r"s_[A-Za-z0-9_-]{22}", session_id)
        fixed = {"run_id": "r_fuzzseededrun000000001", "session_id": session_id}
        base_url = str(server.make_url("")).rstrip("/")
        started = time.monotonic()
        counts = await asyncio.to_thread(_fuzz, base_url, fixed, _routed(server))
        elapsed = time.monotonic() - started
    finally:
        await publisher.close()
        await server.close()
    skipped = counts.pop("nothing to negate", 0)
    total = sum(counts.values())
    with capsys.disabled():
        print(
            f"\nschemathesis {schemathesis.__version__}: {total} cases in {elapsed:.1f}s "
            f"by status {dict(sorted(counts.items()))}; "
            f"{skipped} operation/mode pairs had nothing to negate"
        )
    assert not [code for code in counts if code.startswith("5")], counts
    assert total >= 500, counts
    assert {"200", "204", "400", "401", "404", "405", "409"} <= set(counts), counts
