"""Retries, one budget, tiers and pinning: fault injection through the real server.

Each test counts the fake upstream's hits, which is what a provider would bill.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy.backoff import Backoff
from prism_proxy.testing import eventually

MESSAGES = [{"role": "user", "content": "hello"}]

BILLING_429 = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


def chain(fake, *scenarios: str, **model: object) -> dict:
    return {
        "providers": {s: {"kind": "openai", "base_url": fake.base_url(s)} for s in scenarios},
        "models": {
            "m": {"chain": [{"provider": s, "model": f"up-{s}"} for s in scenarios], **model}
        },
    }


def log_of(headers) -> list[list[str]]:
    return [entry.split()[:3] for entry in headers["x-prism-attempt-log"].split("; ")]


async def chat(gw, **kwargs):
    return await gw.openai().chat.completions.with_raw_response.create(
        model=kwargs.pop("model", "m"), messages=MESSAGES, **kwargs
    )


async def test_billing_exhausted_429_fails_over_after_one_hit(prism_fake, prism_gateway):
    prism_fake.script("first", [Fault(status=429, body=BILLING_429)] * 5)
    gw = await prism_gateway(chain(prism_fake, "first", "second"))
    raw = await chat(gw)
    assert prism_fake.hits("first") == 1
    assert raw.headers["x-prism-provider"] == "second"
    assert log_of(raw.headers)[0] == ["first/up-first", "permanent", "429"]


async def test_plain_429_waits_for_retry_after_then_retries_the_same_binding(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script("first", [Fault(status=429, headers={"Retry-After": "1"})])
    gw = await prism_gateway(chain(prism_fake, "first", "second"), clock=prism_clock)
    began = prism_clock.now()
    raw = await chat(gw)
    assert prism_clock.slept == [1.0]
    assert prism_clock.now() - began >= 1.0
    assert [r.received_at for r in prism_fake.requests("first")][1] - prism_fake.requests("first")[
        0
    ].received_at >= 1.0
    assert prism_fake.hits("first") == 2
    assert prism_fake.hits("second") == 0
    assert log_of(raw.headers) == [
        ["first/up-first", "rate_limited", "429"],
        ["first/up-first", "ok", "200"],
    ]


async def test_retry_after_longer_than_the_budget_moves_on_at_once(prism_fake, prism_gateway):
    prism_fake.script("first", [Fault(status=429, headers={"Retry-After": "3600"})])
    gw = await prism_gateway(chain(prism_fake, "first", "second"))
    started = time.monotonic()
    raw = await chat(gw)
    assert time.monotonic() - started < 1.0
    assert prism_fake.hits("first") == 1
    assert raw.headers["x-prism-provider"] == "second"


async def test_503_503_then_ok_is_served_by_the_same_binding(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.script("first", [Fault(status=503), Fault(status=503)])
    gw = await prism_gateway(chain(prism_fake, "first", "second"), clock=prism_clock)
    raw = await chat(gw)
    assert log_of(raw.headers) == [
        ["first/up-first", "transient", "503"],
        ["first/up-first", "transient", "503"],
        ["first/up-first", "ok", "200"],
    ]
    assert prism_fake.hits("second") == 0


async def test_retries_follow_the_jittered_backoff(prism_fake, prism_gateway):
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    prism_fake.script("first", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        chain(prism_fake, "first", "second"),
        config={"backoff_base_ms": 200, "backoff_cap_ms": 300},
        sleep=sleep,
        random=lambda: 0.5,
    )
    await chat(gw)
    assert waits == [0.1, 0.15]  # 0.5 x min(cap, base x 2^n): full jitter, capped
    assert prism_fake.hits("first") == 3


def test_backoff_is_full_jitter_under_an_exponential_cap():
    backoff = Backoff(base_s=0.25, cap_s=8.0)
    assert [backoff.ceiling(n) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert backoff.delay(3, lambda: 0.0) == 0.0
    assert backoff.delay(3, lambda: 0.999) == pytest.approx(1.998)
    assert backoff.ceiling(10_000) == 8.0


async def test_retries_per_model_override(prism_fake, prism_gateway):
    prism_fake.script("first", [Fault(status=500)] * 5)
    gw = await prism_gateway(chain(prism_fake, "first", "second", retries=0))
    await chat(gw)
    assert prism_fake.hits("first") == 1


async def test_pinned_binding_gets_exactly_one_attempt(prism_fake, prism_gateway):
    prism_fake.script("first", [Fault(status=503)] * 3)
    gw = await prism_gateway(chain(prism_fake, "first", "second"))
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw, model="first/up-first")
    assert info.value.status_code == 503
    assert prism_fake.hits("first") == 1
    assert prism_fake.hits("second") == 0
    raw = await chat(gw, model="second/up-second")
    assert raw.headers["x-prism-attempts"] == "1"


def tiers(fake, **standard: object) -> dict:
    return {
        "providers": {
            "a": {"kind": "openai", "base_url": fake.base_url("err500")},
            "b": {"kind": "openai", "base_url": fake.base_url("err503")},
            "c": {"kind": "openai", "base_url": fake.base_url("cheap")},
        },
        "models": {
            "big": {
                "tier": "premium",
                "chain": [{"provider": "a", "model": "big-a"}, {"provider": "b", "model": "big-b"}],
                "fallback_models": ["small"],
                "retries": 0,
                **standard,
            },
            "small": {"tier": "economy", "chain": [{"provider": "c", "model": "small-c"}]},
        },
    }


async def test_spent_tier_is_a_503_with_the_full_record(prism_fake, prism_gateway):
    gw = await prism_gateway(tiers(prism_fake))
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw, model="big")
    err = info.value
    assert err.status_code == 503
    assert err.code == "upstream_unavailable"
    assert "tier 'premium'" in err.message
    assert [(a["binding"], a["status"]) for a in err.body["attempts"]] == [
        ("a/big-a", 500),
        ("b/big-b", 503),
    ]
    assert "x-prism-fallback" not in err.response.headers
    assert prism_fake.hits("cheap") == 0  # never silently downgraded


@pytest.mark.parametrize("where", ["model", "global"])
async def test_cross_tier_fallback_only_when_switched_on(prism_fake, prism_gateway, where):
    if where == "model":
        gw = await prism_gateway(tiers(prism_fake, cross_tier_fallback=True))
    else:
        gw = await prism_gateway(tiers(prism_fake), config={"cross_tier_fallback": "true"})
    raw = await chat(gw, model="big")
    assert raw.headers["x-prism-fallback"] == "cross-tier"
    assert raw.headers["x-prism-provider"] == "c"
    assert raw.headers["x-prism-model"] == "small-c"
    assert "note cross-tier fallback to small (tier economy)" in raw.headers["x-prism-attempt-log"]


@pytest.mark.parametrize("where", ["model", "global"])
async def test_cross_tier_fallback_left_to_the_caller(prism_fake, prism_gateway, where):
    if where == "model":
        gw = await prism_gateway(tiers(prism_fake, cross_tier_fallback="caller"))
    else:
        gw = await prism_gateway(tiers(prism_fake), config={"cross_tier_fallback": "caller"})
    # A caller that did not ask stays in its tier.
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw, model="big", extra_headers={"x-prism-fallback": "please"})
    assert info.value.status_code == 503
    assert "x-prism-fallback" not in info.value.response.headers
    assert prism_fake.hits("cheap") == 0
    # One that sends x-prism-fallback: allow gets the other tier, and is told so.
    raw = await chat(gw, model="big", extra_headers={"x-prism-fallback": "allow"})
    assert raw.headers["x-prism-fallback"] == "cross-tier"
    assert raw.headers["x-prism-provider"] == "c"


def test_cross_tier_fallback_takes_true_false_or_caller(prism_fake):
    from prism_proxy import ConfigError, config_from_mapping, create_app

    with pytest.raises(ConfigError) as info:
        create_app(
            config_from_mapping({}, catalog_data=tiers(prism_fake, cross_tier_fallback="maybe"))
        )
    assert info.value.key == "models.big.cross_tier_fallback"
    assert '"caller"' in info.value.problem


async def test_model_can_refuse_cross_tier_even_when_on_globally(prism_fake, prism_gateway):
    gw = await prism_gateway(
        tiers(prism_fake, cross_tier_fallback=False), config={"cross_tier_fallback": True}
    )
    with pytest.raises(openai.APIStatusError):
        await chat(gw, model="big")
    assert prism_fake.hits("cheap") == 0


async def past_the_budget(gw, clock, fake, budget_s: float, **kwargs):
    """The call, once the clock passed ``budget_s`` while ``first`` stalled (not before)."""
    async with asyncio.timeout(10):
        answer = asyncio.ensure_future(chat(gw, **kwargs))
        await eventually(lambda: fake.hits("first") == 1)
        clock.advance(budget_s - 0.05)
        assert gw.gateway.current.deadlines.pending == 1  # the budget is not spent yet
        clock.advance(0.15)  # a deadline is kept up to a tenth of a second late
        return await answer


async def test_call_budget_gives_504_in_time_and_ticks_the_counter(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script("first", [Fault(stall_s=30)] * 3)
    prism_fake.script("second", [Fault(stall_s=30)] * 3)
    gw = await prism_gateway(
        chain(prism_fake, "first", "second", call_budget_ms=2500), clock=prism_clock
    )
    with pytest.raises(openai.APIStatusError) as info:
        await past_the_budget(gw, prism_clock, prism_fake, 2.5)
    assert info.value.status_code == 504
    assert info.value.code == "chain_deadline_exceeded"
    assert info.value.body["attempts"][0]["outcome"] == "timeout"
    assert 2500 <= info.value.body["attempts"][0]["ms"] <= 2600
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/stats") as response:
            assert (await response.json())["counters"]["chain_exceeded_max_time"] == 1


async def test_budget_bounds_the_attempt_timeout_header_too(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script("first", [Fault(stall_s=30)])
    gw = await prism_gateway(chain(prism_fake, "first", call_budget_ms=1500), clock=prism_clock)
    with pytest.raises(openai.APIStatusError) as info:
        await past_the_budget(
            gw, prism_clock, prism_fake, 1.5, extra_headers={"x-prism-timeout-ms": "100000"}
        )
    assert info.value.status_code == 504
    assert 1500 <= info.value.body["attempts"][0]["ms"] <= 1600


@pytest.mark.parametrize("stream", [False, True])
async def test_degraded_answer_instead_of_504_when_configured(
    prism_fake, prism_gateway, recorder, stream, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script("first", [Fault(stall_s=30)] * 3)
    gw = await prism_gateway(
        chain(
            prism_fake,
            "first",
            call_budget_ms=1200,
            degraded="{model} is overloaded right now, please retry ({request_id}).",
        ),
        clock=prism_clock,
    )
    raw = await past_the_budget(gw, prism_clock, prism_fake, 1.2, stream=stream)
    if stream:
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    else:
        text = raw.parse().choices[0].message.content
    assert raw.headers["x-prism-outcome"] == "degraded"
    assert text == f"m is overloaded right now, please retry ({raw.headers['x-prism-request-id']})."
    [(_, settlement)] = recorder.settled
    assert settlement.served is None  # nobody served it: nothing to bill


async def test_empty_completion_fallback_policy(prism_fake, prism_gateway):
    gw = await prism_gateway(chain(prism_fake, "empty", "ok", empty="fallback"))
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "ok"
    assert "x-prism-outcome" not in raw.headers
    assert log_of(raw.headers) == [["empty/up-empty", "empty", "200"], ["ok/up-ok", "ok", "200"]]


async def test_auth_failure_code_when_last(prism_fake, prism_gateway):
    gw = await prism_gateway(chain(prism_fake, "err401"))
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    assert info.value.code == "upstream_auth_failed"
    assert prism_fake.hits("err401") == 1


async def test_rate_limit_code_when_last(prism_fake, prism_gateway):
    gw = await prism_gateway(chain(prism_fake, "err429", retries=0))
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    assert info.value.code == "upstream_rate_limited"


async def test_model_not_found_code_when_last(prism_fake, prism_gateway):
    # Not "quota exhausted": the operator must fix the line's model name, not pay.
    gw = await prism_gateway(chain(prism_fake, "err404", retries=0))
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    assert info.value.status_code == 503
    assert info.value.code == "upstream_model_not_found"
    assert prism_fake.hits("err404") == 1  # permanent: never retried


async def test_quota_code_when_last_and_embeddings_prefix(prism_fake, prism_gateway):
    prism_fake.script("err429", [Fault(status=429, body=BILLING_429)])
    catalog = chain(prism_fake, "err429")
    catalog["models"]["e"] = {"chain": [{"provider": "err429", "model": "emb"}]}
    gw = await prism_gateway(catalog)
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().embeddings.create(model="e", input="x")
    assert info.value.code == "runtime_embeddings_failed:upstream_quota_exhausted"


async def test_streaming_retries_before_the_commit_point(prism_fake, prism_gateway, prism_clock):
    prism_fake.script("first", [Fault(status=503), Fault(die_after_chunks=0)])
    gw = await prism_gateway(chain(prism_fake, "first", "second"), clock=prism_clock)
    raw = await chat(gw, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    assert text == "Hello from up-first. This is the fake upstream answering."
    assert log_of(raw.headers) == [
        ["first/up-first", "transient", "503"],
        ["first/up-first", "broken_stream", "200"],
        ["first/up-first", "ok", "200"],
    ]


class FakeTime:
    """An injected clock whose sleep advances it instantly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(("retry_after", "waited"), [("8", [8.0]), ("9.5", [])])
async def test_retry_after_is_honoured_only_if_an_attempt_still_fits(
    prism_fake, prism_gateway, retry_after, waited
):
    fake_time = FakeTime()
    prism_fake.script("first", [Fault(status=503, headers={"Retry-After": retry_after})])
    gw = await prism_gateway(
        chain(prism_fake, "first", "second", call_budget_ms=10_000),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    )
    raw = await chat(gw)
    # 8 s leaves the 1 s an attempt needs inside the 10 s budget; 9.5 s does not.
    assert fake_time.waits == waited
    assert raw.headers["x-prism-provider"] == ("first" if waited else "second")
