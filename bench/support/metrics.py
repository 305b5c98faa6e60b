"""Reading a server's ``/metrics``: every sample by its exposition name.

The Prometheus text format is parsed by ``prometheus_client.parser`` (the library that
writes it on the server side), never by hand. A sample's key is the way the exposition
spells it: ``name`` or ``name{label="value",...}`` in the labels' own order, values
escaped as the format escapes them, so callers look samples up by the text they would
grep for (``whip_sessions_live``, ``whip_admissions_total{outcome="accepted"}``).
"""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_values(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition as ``{"name{labels}": value}``."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escaped(v)}"' for k, v in sample.labels.items())
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


async def metric_values(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Every sample of the server's ``{base}/metrics`` (:func:`sample_values`); raises on
    a non-200 answer. Cancellation: the request is abandoned."""
    async with http.get(f"{base}/metrics") as response:
        response.raise_for_status()
        text = await response.text()
    return sample_values(text)
