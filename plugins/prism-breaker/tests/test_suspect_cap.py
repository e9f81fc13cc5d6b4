"""A suspect binding admits only a few calls at once: a burst moves on instead of piling in."""

from __future__ import annotations

import asyncio

from prism_fake_upstream import Fault

SECTION = {
    "policies": "error_rate",
    "error_rate": 0.25,
    "error_rate_min_calls": 4,  # suspect after 2 counted calls over the rate, isolated at 4
    "suspect_max_inflight": 2,
}


async def test_a_burst_on_a_suspect_binding_is_capped(prism_fake, prism_gateway, kit):
    gw = await prism_gateway(
        kit.catalog("shaky", "steady", retries=0), sections={"breaker": SECTION}
    )
    prism_fake.script("shaky", [Fault(status=500), Fault(status=500)])
    for _ in range(2):
        answer = await kit.chat(gw)
        assert answer.provider == "steady"
    assert (await kit.binding(gw, "shaky/up-shaky"))["state"] == "suspect"
    hits = prism_fake.hits("shaky")

    # Ten callers at once while the suspect binding answers slowly (but answers).
    prism_fake.script("shaky", [Fault(first_token_delay_s=0.3)] * 10)
    answers = await asyncio.gather(*(kit.chat(gw) for _ in range(10)))
    assert all(a.status == 200 for a in answers)
    served = [a.provider for a in answers]
    assert served.count("shaky") == 2
    assert served.count("steady") == 8
    assert prism_fake.hits("shaky") - hits == 2
    moved_on = [a for a in answers if a.provider == "steady"]
    assert all(
        any("skipped breaker: suspect, 2 in flight" in step for step in a.steps) for a in moved_on
    )


async def test_an_eligible_binding_is_not_capped(prism_fake, prism_gateway, kit):
    gw = await prism_gateway(kit.catalog("fine", "steady"), sections={"breaker": SECTION})
    prism_fake.script("fine", [Fault(first_token_delay_s=0.2)] * 10)
    answers = await asyncio.gather(*(kit.chat(gw) for _ in range(10)))
    assert [a.provider for a in answers] == ["fine"] * 10
