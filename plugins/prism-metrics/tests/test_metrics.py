"""GET /metrics through the real server: every family, bounded labels, nothing secret."""

from __future__ import annotations

import asyncio
from typing import Any

from prism_fake_upstream import Fault

from prism_proxy import GATEWAY, SHARED_STATE

from .conftest import chat, samples, scrape, value

PRICE = {"input": 3.0, "output": 15.0}


def catalog(fake, *, rules: bool = False, priced: bool = False) -> dict:
    """Model m: x (eu-west-1) then ok (us-east-1); model slow: x with a 1 s budget."""
    out: dict = {
        "providers": {n: {"kind": "openai", "base_url": fake.base_url(n)} for n in ("x", "ok")},
        "models": {
            "m": {
                "retries": 1,
                "chain": [
                    {"provider": "x", "model": "up-x", "region": "eu-west-1"},
                    {"provider": "ok", "model": "up-ok", "region": "us-east-1"},
                ],
            },
            "slow": {
                "call_budget_ms": 1000,
                "retries": 0,
                "chain": [{"provider": "x", "model": "up-x", "region": "eu-west-1"}],
            },
        },
    }
    if rules:
        out["models"]["m"]["rules"] = [
            {
                "name": "vip",
                "when": {"metadata.tier": "vip"},
                "chain": [{"provider": "ok", "model": "up-ok"}],
            }
        ]
    if priced:
        for model in out["models"].values():
            for line in model["chain"]:
                line["price"] = PRICE
    return out


async def test_every_family_counts_what_a_caller_would_notice(prism_fake, prism_gateway, tmp_path):
    gw = await prism_gateway(
        catalog(prism_fake, rules=True, priced=True),
        sections={
            "billing": {"ledger_path": str(tmp_path / "ledger.sqlite")},
            "breaker": {"policies": "consecutive", "consecutive_failures": 5},
        },
        load_plugins=["openai", "breaker", "billing", "rules", "metrics"],
    )
    # x fails twice (the first try and its retry), then the call fails over to ok.
    prism_fake.script("x", [Fault(status=500), Fault(status=500)])
    assert (await chat(gw.url)).status == 200
    assert (await chat(gw.url)).status == 200  # x serves
    assert (await chat(gw.url, "no-such-model")).status == 404
    assert (await chat(gw.url, metadata={"tier": "vip"})).status == 200  # a rule routes
    prism_fake.script("x", [Fault(stall_s=3.0)])
    assert (await chat(gw.url, "slow")).status == 504  # the budget runs out

    text = await scrape(gw.url)
    assert value(text, "prism_requests_total", model="m", outcome="ok", route="default") == 2
    assert value(text, "prism_requests_total", model="m", route="vip") == 1
    assert value(text, "prism_requests_total", model="unknown", code="model_not_found") == 1
    assert value(text, "prism_requests_total", model="slow", code="chain_deadline_exceeded") == 1
    assert value(text, "prism_attempts_total", provider="x", verdict="transient") == 2
    assert value(text, "prism_attempts_total", provider="x", verdict="ok") == 1
    assert value(text, "prism_attempts_total", provider="ok", region="us-east-1") == 2
    assert value(text, "prism_retries_total", provider="x", upstream_model="up-x") == 1
    assert value(text, "prism_fallbacks_total", model="m", kind="binding") == 1
    assert value(text, "prism_time_to_first_token_seconds_count", provider="ok") == 2
    assert value(text, "prism_request_duration_seconds_count", model="m") == 3
    assert value(text, "prism_inflight") == 0  # every attempt ended
    assert value(text, "prism_chain_exceeded_max_time_total", model="slow") == 1
    assert value(text, "prism_rule_matches_total", model="m", rule="vip") == 1
    assert value(text, "prism_tokens_total", model="m", provider="ok", kind="input") > 0
    assert value(text, "prism_cost_total", model="m", provider="ok") > 0
    assert value(text, "prism_ledger_commit_seconds_count") >= 4
    assert value(text, "prism_breaker_state", provider="x", state="eligible") == 1
    assert value(text, "prism_breaker_state", provider="x", state="isolated") == 0
    ratio = value(text, "prism_binding_error_ratio", provider="x", upstream_model="up-x")
    assert 0 < ratio < 1
    assert value(text, "prism_events_total", event="chain_exceeded_max_time") == 1

    # Buckets that resolve 50 ms to 60 s.
    buckets = {
        dict(ls)["le"] for (n, ls) in samples(text) if n == "prism_request_duration_seconds_bucket"
    }
    assert {"0.05", "60.0", "+Inf"} <= buckets
    # Nothing a caller sent or a key: no prompt, no unknown model name, no request id.
    assert "secret prompt" not in text and "no-such-model" not in text and "req_" not in text


async def test_a_served_stream_stays_in_flight_until_it_ends(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake), load_plugins=["openai", "metrics"])
    prism_fake.script("x", [Fault(token_delay_s=0.2, text="one two three four")])
    call = asyncio.create_task(chat(gw.url, stream=True))
    await asyncio.sleep(0.4)
    during = await scrape(gw.url)
    assert value(during, "prism_inflight", provider="x", region="eu-west-1") == 1
    await call
    assert value(await scrape(gw.url), "prism_inflight") == 0


async def test_org_names_are_labels_only_when_allowed(prism_fake, prism_gateway):
    plain = await prism_gateway(catalog(prism_fake), load_plugins=["openai", "metrics"])
    await chat(plain.url)
    assert 'org="' not in await scrape(plain.url)
    labelled = await prism_gateway(
        catalog(prism_fake),
        sections={"metrics": {"org_label": "true"}},
        load_plugins=["openai", "metrics"],
    )
    await chat(labelled.url)
    assert value(await scrape(labelled.url), "prism_requests_total", org="") == 1


async def test_stats_is_a_view_of_the_same_event_counters(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake), load_plugins=["openai", "metrics"])
    prism_fake.script("x", [Fault(stall_s=3.0)])
    await chat(gw.url, "slow")
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/stats") as response:
            counters = (await response.json())["counters"]
    text = await scrape(gw.url)
    for event, count in counters.items():
        assert value(text, "prism_events_total", event=event) == count


async def test_refused_keys_are_counted_by_reason_and_never_shown(
    prism_fake, prism_gateway, tmp_path
):
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"keys": {"db_path": str(tmp_path / "keys.sqlite")}},
        load_plugins=["openai", "keys", "metrics"],
    )
    bad = {"Authorization": "Bearer sk-prism-not-a-real-key-123"}
    assert (await chat(gw.url, headers=bad)).status == 401
    text = await scrape(gw.url)
    assert value(text, "prism_keys_rejected_total", reason="invalid_api_key") == 1
    assert value(text, "prism_requests_total", code="invalid_api_key") == 1
    assert "sk-prism" not in text


async def test_the_key_refusal_reasons_are_the_ones_the_readme_lists(
    prism_fake, prism_gateway, tmp_path
):
    from pathlib import Path

    from prism_keys import KeyStore

    store = KeyStore(tmp_path / "keys.sqlite")
    store.ensure_schema()
    other_only = store.create_key("acme", ["chat", "model:other"]).key
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"keys": {"db_path": str(store.path)}},
        load_plugins=["openai", "keys", "metrics"],
    )
    assert (await chat(gw.url, headers={"Authorization": "Bearer sk-prism-nope"})).status == 401
    assert (await chat(gw.url, headers={"Authorization": f"Bearer {other_only}"})).status == 403
    counted = {
        dict(labels)["reason"]
        for (name, labels), count in samples(await scrape(gw.url)).items()
        if name == "prism_keys_rejected_total" and count
    }
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `prism_keys_rejected"))
    documented = set(row.split("|")[4].split("`")[1::2])
    assert counted == documented == {"invalid_api_key", "insufficient_scope"}


def test_the_readme_lists_every_metric_and_the_table_nothing_else():
    from pathlib import Path

    from prism_metrics import FAMILIES

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("## `GET /metrics`")[1].split("\n\n| metric |")[1].split("\n\n")[0]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `prism_")}
    assert listed == {family.name for family in FAMILIES}


async def test_cross_tier_and_stand_down_fallbacks_are_told_apart(prism_fake, prism_gateway):
    cat = catalog(prism_fake)
    cat["models"]["m"]["fallback_models"] = ["spare"]
    cat["models"]["m"]["cross_tier_fallback"] = True
    cat["providers"]["sp"] = {"kind": "openai", "base_url": prism_fake.base_url("sp")}
    cat["models"]["spare"] = {"tier": "spare", "chain": [{"provider": "sp", "model": "up-sp"}]}
    cat["models"]["lone"] = {"retries": 0, "chain": [{"provider": "x", "model": "up-x"}]}
    gw = await prism_gateway(
        cat,
        sections={"breaker": {"policies": "consecutive", "consecutive_failures": 1}},
        load_plugins=["openai", "breaker", "metrics"],
    )
    # m's whole chain fails (each line once: one failure isolates it, so no retry):
    # the call moves to the spare tier.
    prism_fake.script("x", [Fault(status=500)])
    prism_fake.script("ok", [Fault(status=500)])
    first = await chat(gw.url)
    assert first.status == 200, first.headers.get("x-prism-attempt-log")
    # lone's only line is isolated now: the breaker stands down and tries it anyway.
    lone = await chat(gw.url, "lone")
    assert lone.status == 200, lone.headers.get("x-prism-attempt-log")
    text = await scrape(gw.url)
    assert value(text, "prism_fallbacks_total", model="m", kind="cross_tier") == 1
    assert value(text, "prism_fallbacks_total", model="lone", kind="stand_down") == 1


async def test_shared_state_up_follows_redis(prism_fake, prism_gateway, prism_redis):
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"redis": {"url": prism_redis.url, "key_prefix": prism_redis.prefix}},
        load_plugins=["openai", "breaker", "redis", "metrics"],
    )
    assert value(await scrape(gw.url), "prism_shared_state_up") == 1
    shared: Any = gw.app[GATEWAY].current.services.get(SHARED_STATE)
    shared.failed(OSError("gone"))  # as a failed command would mark it
    assert value(await scrape(gw.url), "prism_shared_state_up") == 0
