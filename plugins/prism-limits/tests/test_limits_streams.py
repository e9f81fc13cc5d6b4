"""A stream that has started is never cut for a limit, and its real cost counts."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from prism_fake_upstream import Fault

from .conftest import catalog

HI = [{"role": "user", "content": "hi"}]
PLUGINS = ["openai", "anthropic", "limits", "billing"]
WORDS = " ".join(f"w{n}" for n in range(30))


async def start(prism_gateway: Any, prism_fake: Any, tmp_path: Any) -> Any:
    return await prism_gateway(
        catalog(prism_fake),
        sections={"billing": {"ledger_path": str(tmp_path / "ledger.sqlite")}},
        load_plugins=PLUGINS,
    )


async def test_a_started_stream_outlives_the_budget_running_out_and_its_cost_counts(
    prism_gateway, prism_fake, callers, tmp_path
):
    # Room for one reservation (about 0.0002 with max_tokens 100), not two.
    callers.org("acme", budget="0.0003/day")
    prism_fake.script("a", [Fault(text=WORDS, token_delay_s=0.02)])
    gw = await start(prism_gateway, prism_fake, tmp_path)
    async with gw.openai(default_headers={"x-test-key": "k@acme"}) as client:
        stream = await client.chat.completions.create(
            model="m", messages=HI, max_tokens=100, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        pieces = []
        async for chunk in stream:
            pieces.append(chunk)
            if len(pieces) == 3:
                # While it streams, the budget has no room for another call.
                with pytest.raises(openai.RateLimitError) as refused:
                    await client.chat.completions.create(model="m", messages=HI, max_tokens=100)
                assert refused.value.code == "budget_exceeded"
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text.split() == WORDS.split()  # whole: nothing was cut
    assert pieces[-1].usage is not None
    # It settled at its real cost, far below its reservation: room again.
    [row] = _rows(tmp_path / "ledger.sqlite")
    assert 0 < Decimal(row["cost_nanos"]).scaleb(-9) < Decimal("0.0001")
    async with gw.openai(default_headers={"x-test-key": "k@acme"}) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, max_tokens=100
        )
    left = Decimal(raw.headers["x-prism-budget-remaining"])
    assert left < Decimal("0.0003") - Decimal(row["cost_nanos"]).scaleb(-9)


async def test_the_anthropic_sdk_sees_a_budget_refusal_and_does_not_retry_it(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", budget="0/month")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    async with gw.anthropic(default_headers={"x-test-key": "k@acme"}, max_retries=3) as client:
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.create(model="m", max_tokens=10, messages=HI)
    error = refused.value.body["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "budget_exceeded"
    assert "organisation acme budget 0/month" in error["message"]
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert prism_fake.hits("a") == 0


async def test_a_stream_holds_its_parallel_slot_until_it_ends(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", max_parallel="1")
    prism_fake.script("a", [Fault(text=WORDS, token_delay_s=0.02)])
    gw = await start(prism_gateway, prism_fake, tmp_path)
    async with gw.openai(default_headers={"x-test-key": "k@acme"}) as client:
        stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
        first = await anext(aiter(stream))
        assert first is not None
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="m", messages=HI)
        assert "max_parallel 1" in refused.value.message
        async for _ in stream:
            pass
        served = await client.chat.completions.create(model="m", messages=HI)
        assert served.choices[0].message.content


def _rows(path: Any) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [
            dict(row) for row in conn.execute("SELECT * FROM ledger WHERE provider IS NOT NULL")
        ]
    finally:
        conn.close()
