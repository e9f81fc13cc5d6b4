"""A hit is billed and limited as a call of its own: outcome ``cached``, at its cache price."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import eventually

from .conftest import HI, PRICE, catalog

PLUGINS = ["openai", "anthropic", "cache", "billing", "limits", "metrics"]


def rows(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute("SELECT * FROM ledger ORDER BY ts, rowid")]
    finally:
        conn.close()


async def chat(gw: Any) -> Any:
    async with gw.openai() as client:
        return await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, temperature=0
        )


async def test_a_hit_writes_a_cached_row_at_the_cache_price_and_counts_toward_limits(
    prism_gateway, prism_fake, tmp_path
):
    ledger = tmp_path / "ledger.sqlite"
    cat = catalog(prism_fake, price=PRICE, cache_price={"request": 0.000001})
    gw = await prism_gateway(
        cat,
        sections={
            "cache": {"store": "memory"},
            "billing": {"ledger_path": str(ledger), "require_prices": False},
            "limits": {"rpm": 3, "budget": "10/day"},
        },
        load_plugins=PLUGINS,
    )
    await chat(gw)
    second = await chat(gw)
    assert second.headers["x-prism-cache"] == "hit"
    assert second.headers["x-prism-cost"] == "0.000001"
    third = await chat(gw)
    assert third.headers["x-prism-cache"] == "hit"
    with pytest.raises(openai.RateLimitError):
        await chat(gw)  # rpm 3: the hits counted
    assert prism_fake.hits("a") == 1
    written = rows(ledger)
    assert [row["outcome"] for row in written] == ["ok", "cached", "cached", "error"]
    ok, hit = written[0], written[1]
    assert hit["provider"] == "a" and hit["upstream_model"] == "up"
    assert (hit["input_tokens"], hit["output_tokens"]) == (ok["input_tokens"], ok["output_tokens"])
    assert hit["cost_nanos"] == 1_000 and hit["attempts"] == 0
    assert ok["cost_nanos"] > hit["cost_nanos"]
    # The budget counted the hit before it at its cache price (each call reserves alike).
    before, after = (Decimal(raw.headers["x-prism-budget-remaining"]) for raw in (second, third))
    assert before - after == Decimal("0.000001")

    async def scraped() -> str:
        async with aiohttp.ClientSession() as session:
            async with session.get(gw.url + "/metrics") as response:
                return await response.text()

    text = await scraped()
    assert 'prism_cache_lookups_total{model="m",result="hit"} 2.0' in text
    assert 'prism_cache_lookups_total{model="m",result="miss"} 1.0' in text
    saved = ok["input_tokens"] + ok["output_tokens"]
    assert f'prism_cache_tokens_saved_total{{model="m"}} {float(2 * saved)}' in text
    assert 'outcome="cached"' in text


async def test_without_a_cache_price_a_hit_costs_nothing(prism_gateway, prism_fake, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    gw = await prism_gateway(
        catalog(prism_fake, price=PRICE),
        sections={
            "cache": {"store": "memory"},
            "billing": {"ledger_path": str(ledger), "require_prices": False},
        },
        load_plugins=PLUGINS,
    )
    await chat(gw)
    hit = await chat(gw)
    assert hit.headers["x-prism-cost"] == "0"
    assert [row["cost_nanos"] for row in rows(ledger)][1] == 0


async def test_a_mistaken_cache_key_in_the_catalog_is_named(prism_gateway, prism_fake):
    from prism_proxy import ConfigError

    with pytest.raises(ConfigError, match=r"models\.m\.cache_ttl_s"):
        await prism_gateway(
            catalog(prism_fake, model={"cache_ttl_s": "soon"}),
            sections={"cache": {"store": "memory"}},
            load_plugins=PLUGINS,
        )
    with pytest.raises(ConfigError, match=r"cache_price\.per_hit"):
        await prism_gateway(catalog(prism_fake, cache_price={"per_hit": 1}), load_plugins=PLUGINS)


async def test_a_stream_cut_short_is_not_kept(prism_gateway, prism_fake):
    gw = await prism_gateway(
        catalog(prism_fake), sections={"cache": {"store": "memory"}}, load_plugins=PLUGINS
    )
    prism_fake.script("a", [Fault(die_after_chunks=2)])
    async with gw.openai(max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m", messages=HI, temperature=0, stream=True
        )
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass
    assert (await chat(gw)).headers["x-prism-cache"] == "miss"
    await eventually(lambda: prism_fake.hits("a") == 2)
