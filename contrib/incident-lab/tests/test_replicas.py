"""A scenario with replicas: several `prism serve`s sharing a Redis of the run's own."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from prism_lab import load_scenario
from prism_lab.cli import run

SHORT = Path(__file__).with_name("short.toml")

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="replicas share a redis-server the lab starts"
)


def served_rows(ledger: Path) -> int:
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        [(rows,)] = db.execute("SELECT count(*) FROM ledger WHERE provider IS NOT NULL")
    return int(rows)


async def test_two_replicas_share_the_traffic_and_the_breaker(tmp_path):
    text = SHORT.read_text().replace("seed = 7\n", "seed = 7\nreplicas = 2\n", 1)
    path = tmp_path / "replicas.toml"
    path.write_text(text)
    scenario = load_scenario(path)
    assert scenario.replicas == 2
    [summary] = await run(scenario, tmp_path / "out")

    assert summary["calls"] > 100
    assert summary["failed"] == 0
    assert summary["served"] == summary["calls"]
    # Both gateways served and wrote their own ledger.
    ledgers = sorted((tmp_path / "out" / "breaker" / "gateway").glob("ledger*.sqlite"))
    assert [p.name for p in ledgers] == ["ledger0.sqlite", "ledger1.sqlite"]
    assert all(served_rows(p) > 20 for p in ledgers)
    # The primary's isolation is the fleet's: the sick line is left within a few
    # scenario seconds, and fallbacks are priced from both ledgers.
    [fault] = summary["faults"]
    assert fault["isolated_after_s"] is not None and fault["isolated_after_s"] < 5
    assert summary["served_by_fallback"] > 20
    assert summary["fallback_extra_cost"] > 0
