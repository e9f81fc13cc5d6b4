"""contrib/grafana/prism.json: every metric its queries name is one Prism exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

DASHBOARD = Path(__file__).resolve().parents[1] / "prism.json"
METRIC = re.compile(r"\bprism_[a-z0-9_]+\b")


def queries(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [q for value in node.values() for q in queries(value)]
    if isinstance(node, list):
        return [q for item in node for q in queries(item)]
    return []


def exported_names(text: str) -> set[str]:
    """Sample names a scrape can hold, from its ``# TYPE`` lines."""
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, name, kind = line.split(" ", 3)
        if kind == "counter":  # the TYPE line names it with or without _total
            base = name.removesuffix("_total")
            names |= {base + "_total", base + "_created"}
        elif kind == "histogram":
            names |= {name + suffix for suffix in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(name)
    return names


async def test_every_metric_the_dashboard_queries_is_exported(prism_fake, prism_gateway):
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "up"}]}},
    }
    gw = await prism_gateway(catalog, load_plugins=["openai", "breaker", "metrics"])
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as response:
            exported = exported_names(await response.text())
    exprs = queries(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 10
    named = {name for expr in exprs for name in METRIC.findall(expr)}
    assert named, "the dashboard names no metric"
    assert named - exported == set()
    # The board's rows are there: tiles from the breaker state, error rate, latency, cost.
    for wanted in ("prism_breaker_state", "prism_binding_error_ratio",
                   "prism_time_to_first_token_seconds_bucket", "prism_fallbacks_total",
                   "prism_cost_total"):  # fmt: skip
        assert wanted in named
