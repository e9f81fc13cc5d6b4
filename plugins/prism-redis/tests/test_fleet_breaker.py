"""The breaker shared by several gateways through Redis (in one test process: fast to drive)."""

from __future__ import annotations

import asyncio

from prism_fake_upstream import Fault

from .conftest import binding_state, chat, get_json, two_line_catalog, until


async def test_an_isolation_on_one_gateway_is_skipped_by_the_others_within_a_second(
    prism_fake, fleet
):
    a, b, c = await fleet(3, two_line_catalog(prism_fake))
    prism_fake.script("x", [Fault(status=500)] * 3)
    for _ in range(3):
        assert (await chat(a.url)).provider == "ok"  # x failed, the fallback served
    assert await binding_state(a.url, "x/up-x") == "isolated"

    async def everyone_skips() -> bool:
        states = [await binding_state(gw.url, "x/up-x") for gw in (b, c)]
        return states == ["isolated", "isolated"]

    assert await until(everyone_skips, timeout_s=5) < 1.0
    hits = prism_fake.hits("x")
    for gw in (b, c):
        answer = await chat(gw.url)
        assert answer.provider == "ok"
        assert "x/up-x skipped breaker: isolated" in answer.log
    assert prism_fake.hits("x") == hits  # nobody tried x again

    # One transition in the shared audit, written by the gateway that decided.
    audit = await get_json(a.url, "/prism/health")
    entry = next(e for e in audit["bindings"] if e["binding"] == "x/up-x")
    assert entry["revision"] == 2  # eligible -> suspect -> isolated, once for the fleet


async def test_the_error_rate_trips_on_traffic_split_across_gateways(prism_fake, fleet):
    # 12 calls are needed to judge; each gateway sees only 4 of them.
    breaker = {"policies": "error_rate", "error_rate": 0.25, "error_rate_min_calls": 12}
    gateways = await fleet(3, two_line_catalog(prism_fake), breaker=breaker)
    prism_fake.script("x", [Fault(status=500), Fault()] * 6)
    for i in range(12):
        await chat(gateways[i % 3].url)
        await asyncio.sleep(0.05)

    async def isolated_everywhere() -> bool:
        states = {await binding_state(gw.url, "x/up-x") for gw in gateways}
        return states == {"isolated"}

    await until(isolated_everywhere, timeout_s=5)
    health = await get_json(gateways[0].url, "/prism/health")
    cause = next(e["cause"] for e in health["bindings"] if e["binding"] == "x/up-x")
    assert cause.startswith("error rate 50%"), cause


async def test_no_gateway_trips_on_its_own_share_without_the_fleet(prism_fake, prism_gateway):
    # The control: the same traffic split over gateways that share nothing never trips.
    breaker = {"policies": "error_rate", "error_rate": 0.25, "error_rate_min_calls": 12}
    gateways = [
        await prism_gateway(
            two_line_catalog(prism_fake),
            sections={"breaker": breaker},
            load_plugins=["openai", "breaker"],
        )
        for _ in range(3)
    ]
    prism_fake.script("x", [Fault(status=500), Fault()] * 6)
    for i in range(12):
        await chat(gateways[i % 3].url)
    await asyncio.sleep(0.3)
    states = {await binding_state(gw.url, "x/up-x") for gw in gateways}
    assert states <= {"eligible", "suspect"}


async def test_one_trial_call_for_the_whole_fleet(prism_fake, fleet):
    gateways = await fleet(3, two_line_catalog(prism_fake), breaker={"isolation_s": 1})
    prism_fake.script("x", [Fault(status=500)] * 3)
    for _ in range(3):
        await chat(gateways[0].url)

    async def in_trial_everywhere() -> bool:
        states = {await binding_state(gw.url, "x/up-x") for gw in gateways}
        return states == {"trial"}

    await until(in_trial_everywhere, timeout_s=10)
    hits = prism_fake.hits("x")
    answers = await asyncio.gather(*(chat(gateways[i % 3].url) for i in range(30)))
    assert all(a.status == 200 for a in answers)
    assert prism_fake.hits("x") == hits + 1
    trial = [a for a in answers if a.provider == "x"]
    assert len(trial) == 1 and trial[0].headers["x-prism-breaker"] == "trial x/up-x"
    refused = [a for a in answers if "trial in progress on another gateway" in a.log]
    assert refused, [a.log for a in answers]


async def test_a_late_completion_is_judged_against_the_shared_revision(prism_fake, fleet):
    a, b = await fleet(2, two_line_catalog(prism_fake))
    # A's call stalls on x; meanwhile B sees x fail three times and isolates it.
    prism_fake.script("x", [Fault(status=500, stall_s=1.0)] + [Fault(status=500)] * 3)
    slow = asyncio.create_task(chat(a.url))
    await until(lambda: _hit(prism_fake, "x", 1))
    for _ in range(3):
        await chat(b.url)

    async def a_sees_it() -> bool:
        return await binding_state(a.url, "x/up-x") == "isolated"

    await until(a_sees_it, timeout_s=5)
    await slow  # its failure started before the isolation: not evidence of anything now
    health = await get_json(a.url, "/prism/health")
    entry = next(e for e in health["bindings"] if e["binding"] == "x/up-x")
    assert entry["counts"]["stale_ignored"] == 1
    assert entry["state"] == "isolated" and entry["revision"] == 2


async def _hit(fake, scenario: str, n: int) -> bool:
    return fake.hits(scenario) >= n
