"""Limits on one gateway: what callers see, through the real server and the official SDKs."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy import Settlement, hookimpl

from .conftest import catalog

HI = [{"role": "user", "content": "hi"}]
PLUGINS = ["openai", "anthropic", "limits", "billing"]


async def start(prism_gateway: Any, prism_fake: Any, tmp_path: Any, **limits: Any) -> Any:
    return await prism_gateway(
        catalog(prism_fake),
        sections={
            "billing": {"ledger_path": str(tmp_path / "ledger.sqlite")},
            "limits": limits,
        },
        load_plugins=PLUGINS,
    )


async def chat(gw: Any, key: str, **body: Any) -> Any:
    async with gw.openai(default_headers={"x-test-key": key}) as client:
        return await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, **body
        )


async def test_an_organisations_rpm_serves_that_many_then_says_which_limit(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", rpm="3")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    remaining = []
    for _ in range(3):
        raw = await chat(gw, "k1@acme")
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(raw.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "k2@acme")  # another key of the same organisation
    err = refused.value
    assert err.status_code == 429
    assert err.code == "rate_limited"
    assert "organisation acme rpm 3" in err.message
    assert 1 <= int(err.response.headers["Retry-After"]) <= 60
    assert prism_fake.hits("a") == 3  # the refused call reached no upstream
    # Another organisation is not touched by acme's limit.
    assert (await chat(gw, "k3@other")).http_response.status_code == 200


async def test_a_keys_limit_applies_inside_its_organisations(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", rpm="100")
    callers.key("small", rpm="1")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    await chat(gw, "small@acme")
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "small@acme")
    assert "key small rpm 1" in refused.value.message
    # Both limits are reported; the tightest one is in the headers.
    raw = await chat(gw, "big@acme")
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert raw.headers["x-ratelimit-remaining-requests"] == "98"


async def test_a_per_model_limit_applies_to_that_model_only(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", **{"rpm@m": "1"})
    gw = await start(prism_gateway, prism_fake, tmp_path)
    await chat(gw, "k@acme")
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "k@acme")
    assert "organisation acme rpm@m 1" in refused.value.message


async def test_max_parallel_caps_calls_in_flight_at_the_upstream(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", max_parallel="2")
    prism_fake.script("a", [Fault(first_token_delay_s=0.4)] * 2)
    gw = await start(prism_gateway, prism_fake, tmp_path)
    outcomes = await asyncio.gather(*(chat(gw, "k@acme") for _ in range(5)), return_exceptions=True)
    served = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(served) == 2 and len(refused) == 3
    assert all("max_parallel 2" in err.message for err in refused)
    assert prism_fake.hits("a") == 2
    # Once they settled, their slots are free again.
    assert (await chat(gw, "k@acme")).http_response.status_code == 200


async def test_tpm_counts_the_tokens_really_used(prism_gateway, prism_fake, callers, tmp_path):
    callers.org("acme", tpm="100")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    # Reserved: the prompt estimate plus max_tokens 60; the fake's answer uses far less.
    first = await chat(gw, "k@acme", max_tokens=60)
    used = first.parse().usage.total_tokens
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 40
    second = await chat(gw, "k@acme", max_tokens=60)
    # The first call's reservation was replaced by what it used, so the second fit.
    assert int(second.headers["x-ratelimit-remaining-tokens"]) <= 100 - used - 60
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "k@acme", max_tokens=90)
    assert "organisation acme tpm 100" in refused.value.message


class Refusals:
    def __init__(self) -> None:
        self.codes: list[str | None] = []

    @hookimpl
    def prism_settle(self, call: Any, settlement: Settlement) -> None:
        self.codes.append(settlement.error_code)


async def test_a_spent_budget_refuses_and_the_sdk_does_not_retry(
    prism_gateway, prism_fake, callers, tmp_path, prism_plugin
):
    settled = Refusals()
    prism_plugin(settled, "test-settled")
    # Each call reserves its worst case: ~1 prompt token at 1/M plus 1000 output at 2/M.
    callers.org("acme", budget="0.0025/day")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    served = 0
    budget_left = []
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(100):
            async with gw.openai(default_headers={"x-test-key": "k@acme"}, max_retries=3) as client:
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=HI, max_tokens=1000
                )
            budget_left.append(Decimal(raw.headers["x-prism-budget-remaining"]))
            served += 1
    err = refused.value
    assert err.code == "budget_exceeded"
    assert err.type == "insufficient_quota"
    assert "organisation acme budget 0.0025/day" in err.message
    assert err.response.headers["x-should-retry"] == "false"
    assert int(err.response.headers["Retry-After"]) >= 1
    # The SDK asked once (max_retries=3): budget refusals are not worth retrying.
    assert settled.codes.count("budget_exceeded") == 1
    assert served >= 2 and budget_left == sorted(budget_left, reverse=True)
    billed = sum(
        Decimal(row["cost_nanos"]) for row in _ledger_rows(tmp_path / "ledger.sqlite")
    ).scaleb(-9)
    assert 0 < billed <= Decimal("0.0025")


async def test_the_anthropic_sdk_sees_its_own_rate_limit_error(
    prism_gateway, prism_fake, callers, tmp_path
):
    callers.org("acme", rpm="0")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    async with gw.anthropic(default_headers={"x-test-key": "k@acme"}) as client:
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.create(model="m", max_tokens=10, messages=HI)
    body = refused.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == "rate_limited"


async def test_a_caller_without_limits_gets_no_limit_headers(
    prism_gateway, prism_fake, callers, tmp_path
):
    gw = await start(prism_gateway, prism_fake, tmp_path)
    raw = await chat(gw, "k@acme")
    assert "x-ratelimit-limit-requests" not in raw.headers
    assert "x-prism-budget-remaining" not in raw.headers


async def test_the_section_limits_callers_without_an_organisation(
    prism_gateway, prism_fake, callers, tmp_path
):
    gw = await start(prism_gateway, prism_fake, tmp_path, rpm=1)
    await chat(gw, "lonely")
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "lonely")
    assert "default lonely rpm 1" in refused.value.message
    await chat(gw, "other")  # each key without an organisation on its own
    await chat(gw, "k@acme")  # an organisation's callers are not defaults


async def test_me_tells_a_key_its_own_limits_only(prism_gateway, prism_fake, callers, tmp_path):
    callers.org("acme", rpm="5", budget="10/month")
    callers.key("mine", tpm="1000")
    callers.org("rival", rpm="7")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    await chat(gw, "mine@acme")
    async with aiohttp.ClientSession() as http:
        response = await http.get(f"{gw.url}/prism/me", headers={"x-test-key": "mine@acme"})
        me = await response.json()
        text = await response.text()
    assert me["key_id"] == "mine" and me["organisation"] == "acme"
    by_limit = {(entry["scope"], entry["limit"]): entry for entry in me["limits"]}
    assert by_limit[("organisation", "rpm")]["remaining"] == 4
    assert by_limit[("organisation", "budget")]["period"] == "month"
    assert by_limit[("key", "tpm")]["value"] == 1000
    assert "rival" not in text
    assert all(entry["value"] != 7 for entry in me["limits"])


def _ledger_rows(path: Any) -> list[dict[str, Any]]:
    import sqlite3

    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute("SELECT * FROM ledger")]
    finally:
        conn.close()
