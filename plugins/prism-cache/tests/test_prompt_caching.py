"""Provider prompt caching: cache reads and writes billed at the line's own prices, both wires.

Billed by prism-billing from the usage the core reads; checked here through the
real server with the ledger and ``x-prism-cost``, for OpenAI's cached tokens and
Anthropic's cache reads and writes, with ``cache_control`` passed through as sent.
"""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from typing import Any

from prism_fake_upstream import Fault

PRICE = {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}
PLUGINS = ["openai", "anthropic", "billing"]


def per_million(tokens: int, price: float) -> Decimal:
    return Decimal(tokens) * Decimal(repr(price)) / Decimal(1_000_000)


async def start(prism_gateway: Any, prism_fake: Any, tmp_path: Any) -> Any:
    catalog = {
        "providers": {
            "a": {"kind": "openai", "base_url": prism_fake.base_url("a")},
            "c": {"kind": "anthropic", "base_url": prism_fake.base_url("c")},
        },
        "models": {
            "m": {"retries": 0, "chain": [{"provider": "a", "model": "up", "price": PRICE}]},
            "claude": {"retries": 0, "chain": [{"provider": "c", "model": "up", "price": PRICE}]},
        },
    }
    return await prism_gateway(
        catalog,
        sections={"billing": {"ledger_path": str(tmp_path / "ledger.sqlite")}},
        load_plugins=PLUGINS,
    )


def ledger(tmp_path: Any) -> list[tuple[int, int, int, int, int]]:
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    try:
        return list(
            conn.execute(
                "SELECT input_tokens, cached_input_tokens, cache_creation_tokens, "
                "output_tokens, cost_nanos FROM ledger ORDER BY ts"
            )
        )
    finally:
        conn.close()


async def test_openai_cached_input_tokens_are_billed_at_cached_input(
    prism_gateway, prism_fake, tmp_path
):
    gw = await start(prism_gateway, prism_fake, tmp_path)
    prism_fake.script(
        "a",
        [Fault(usage={"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 800}})],
    )
    async with gw.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    out = raw.parse().usage.completion_tokens
    expected = per_million(200, 3.0) + per_million(800, 0.3) + per_million(out, 15.0)
    assert Decimal(raw.headers["x-prism-cost"]) == expected
    assert ledger(tmp_path) == [(1000, 800, 0, out, int(expected * 10**9))]


async def test_anthropic_cache_reads_and_writes_are_billed_and_cache_control_passes(
    prism_gateway, prism_fake, tmp_path
):
    gw = await start(prism_gateway, prism_fake, tmp_path)
    usage = {"input_tokens": 10, "cache_read_input_tokens": 500, "cache_creation_input_tokens": 300}
    prism_fake.script("c", [Fault(usage=usage)])
    system = [{"type": "text", "text": "a long policy", "cache_control": {"type": "ephemeral"}}]
    async with gw.anthropic() as claude:
        raw = await claude.messages.with_raw_response.create(
            model="claude",
            max_tokens=50,
            system=system,
            messages=[{"role": "user", "content": "hi"}],
        )
        message = await raw.parse()
    sent = prism_fake.requests("c")[-1].body
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral"}  # passed as sent
    assert message.usage.cache_read_input_tokens == 500
    out = message.usage.output_tokens
    expected = (
        per_million(10, 3.0)
        + per_million(500, 0.3)
        + per_million(300, 3.75)
        + per_million(out, 15.0)
    )
    assert Decimal(raw.headers["x-prism-cost"]) == expected
    assert ledger(tmp_path) == [(810, 500, 300, out, int(expected * 10**9))]
