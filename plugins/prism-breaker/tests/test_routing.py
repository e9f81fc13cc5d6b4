"""The breaker in the real gateway: skipping, trials, stand-down, what never counts.

Time is the gateway's injected clock (``prism_gateway(..., clock=...)``);
the fake upstream's hit counts are what a provider would bill.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import out_of_file_handles

MESSAGES = [{"role": "user", "content": "hello"}]
DEAD_RETRY_VETOED = "dead/up-dead vetoed breaker: isolated"


async def test_a_dead_first_binding_costs_one_call_per_isolation_window(
    prism_fake, prism_gateway, kit, fake_time
):
    prism_fake.script("dead", [Fault(status=500)] * 1000)
    gw = await prism_gateway(
        kit.catalog("dead", "ok"),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        random=lambda: 0.5,
    )
    trials = []
    for n in range(200):
        answer = await kit.chat(gw)
        assert answer.status == 200 and answer.provider == "ok", n
        if "x-prism-breaker" in answer.headers:
            trials.append((answer.headers["x-prism-breaker"], answer.steps))
        fake_time.advance(5.0)
    # 1000 s of traffic, one request every 5 s: the first request pays the three
    # tries that trip the breaker; after that only the trial caller of each
    # window (30, 60, 120, 240, 480 s) pays, once: its retries are vetoed.
    trial_log = ["dead/up-dead transient 500", DEAD_RETRY_VETOED, "ok/up-ok ok 200"]
    assert trials == [("trial dead/up-dead", trial_log)] * 5
    assert prism_fake.hits("dead") == 3 + 5
    assert prism_fake.hits("ok") == 200
    dead = await kit.binding(gw, "dead/up-dead")
    assert dead["state"] == "isolated"
    assert dead["cause"].startswith("trial failed: transient 500")


async def test_skipped_binding_is_in_the_attempt_record(prism_fake, prism_gateway, kit):
    prism_fake.script("dead", [Fault(status=503)] * 3)
    gw = await prism_gateway(kit.catalog("dead", "ok"))
    first = await kit.chat(gw)
    # The third failure isolates dead: no retry is left to veto (retries = 2).
    assert first.steps == ["dead/up-dead transient 503"] * 3 + ["ok/up-ok ok 200"]
    second = await kit.chat(gw)
    assert second.log[0] == "dead/up-dead skipped breaker: isolated"
    assert second.headers["x-prism-attempts"] == "1"
    assert prism_fake.hits("dead") == 3


async def test_every_binding_out_stands_down_and_tries_the_whole_chain(
    prism_fake, prism_gateway, kit
):
    prism_fake.script("a", [Fault(status=500)] * 3)  # then healthy again
    prism_fake.script("b", [Fault(status=502)] * 4)
    gw = await prism_gateway(kit.catalog("a", "b"))
    first = await kit.chat(gw)
    assert first.status == 503  # both tripped on the way down the chain
    second = await kit.chat(gw)
    assert second.status == 200 and second.provider == "a"
    assert second.headers["x-prism-breaker"] == "stand-down"
    assert "note breaker: every binding is out, standing down, trying them all" in second.log
    third = await kit.chat(gw)  # standing down again: a answers, b is never reached
    assert third.status == 200 and third.provider == "a"
    assert (prism_fake.hits("a"), prism_fake.hits("b")) == (5, 3)
    health = await kit.health(gw)
    assert health["stand_downs"] == 2
    # Answers during a stand-down do not cut an isolation short: the window decides.
    assert {b["binding"]: b["state"] for b in health["bindings"]} == {
        "a/up-a": "isolated",
        "b/up-b": "isolated",
    }


async def test_a_stand_down_that_fails_answers_with_the_real_upstream_error(
    prism_fake, prism_gateway, kit
):
    gw = await prism_gateway(kit.catalog("err500"))
    await kit.chat(gw)
    answer = await kit.chat(gw)
    assert answer.status == 503
    assert answer.body["error"]["code"] == "upstream_unavailable"
    attempts = [a for a in answer.body["error"]["attempts"] if "status" in a]
    assert [a["status"] for a in attempts] == [500]
    # A stand-down tries each binding once: the isolated binding's retries are vetoed.
    assert "err500/up-err500 vetoed breaker: isolated" in answer.log
    assert prism_fake.hits("err500") == 4  # three to trip, then one per stand-down call


async def test_one_trial_caller_among_fifty_concurrent_callers(
    prism_fake, prism_gateway, kit, fake_time
):
    # Still dead at trial time, and slow to say so: the trial is in flight
    # while the other 49 callers arrive.
    prism_fake.script("dead", [Fault(status=500)] * 3 + [Fault(status=500, stall_s=0.5)])
    gw = await prism_gateway(
        kit.catalog("dead", "ok"), clock=fake_time.clock, sleep=fake_time.sleep
    )
    await kit.chat(gw)
    assert prism_fake.hits("dead") == 3
    fake_time.advance(31)
    answers = await asyncio.gather(*(kit.chat(gw) for _ in range(50)))
    assert all(a.status == 200 and a.provider == "ok" for a in answers)
    marked = [a for a in answers if a.headers.get("x-prism-breaker") == "trial dead/up-dead"]
    assert len(marked) == 1
    assert marked[0].steps == [
        "dead/up-dead transient 500",
        DEAD_RETRY_VETOED,  # the failed trial is not retried
        "ok/up-ok ok 200",
    ]
    skipped = [a for a in answers if a.log[0] == "dead/up-dead skipped breaker: trial in progress"]
    isolated = [a for a in answers if a.log[0] == "dead/up-dead skipped breaker: isolated"]
    assert len(skipped) + len(isolated) == 49
    assert prism_fake.hits("dead") == 4


async def test_a_trial_that_passes_restores_the_binding(prism_fake, prism_gateway, kit, fake_time):
    prism_fake.script("flaky", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        kit.catalog("flaky", "ok"),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        # No slow start here: this is about the trial (the ramp has its own tests).
        sections={"breaker": {"trial_min_successes": 3, "trial_min_duration_s": 20, "ramp_s": 0}},
    )
    await kit.chat(gw)
    fake_time.advance(30)
    served_by = []
    for _ in range(6):
        answer = await kit.chat(gw, stream=True)
        served_by.append((answer.provider, answer.headers.get("x-prism-breaker")))
        fake_time.advance(10)
    trial = ("flaky", "trial flaky/up-flaky")
    # Trial calls are paced one at a time; restoration needs 3 successes over 20 s.
    assert served_by == [trial, trial, trial, ("flaky", None), ("flaky", None), ("flaky", None)]
    flaky = await kit.binding(gw, "flaky/up-flaky")
    assert flaky["state"] == "eligible"
    assert flaky["cause"] == "trial passed: 3 successes over 20 s"
    assert flaky["assessment"] == "uncertain"  # 3 calls are too few to call it healthy


@pytest.mark.parametrize(
    ("scenario", "expected_status"),
    [("err429", 503), ("err400", 400), ("empty", 200)],
)
async def test_rate_limits_request_errors_and_empties_never_trip(
    prism_fake, prism_gateway, kit, fake_time, scenario, expected_status
):
    gw = await prism_gateway(kit.catalog(scenario), clock=fake_time.clock, sleep=fake_time.sleep)
    for _ in range(10):
        answer = await kit.chat(gw)
        assert answer.status == expected_status
    entry = await kit.binding(gw, f"{scenario}/up-{scenario}")
    assert (entry["state"], entry["consecutive_failures"]) == ("eligible", 0)
    assert entry["window"]["calls"] == 0
    # 429s are retried (3 tries a call); nothing was ever skipped.
    assert prism_fake.hits(scenario) == (30 if scenario == "err429" else 10)


async def test_cancellations_never_trip(prism_fake, prism_gateway, kit):
    prism_fake.script("slow", [Fault(stall_s=5)] * 6)
    gw = await prism_gateway(kit.catalog("slow"))
    timeout = aiohttp.ClientTimeout(total=0.3)

    async def leave_early() -> None:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(TimeoutError):
                await session.post(
                    gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
                )

    await asyncio.gather(*(leave_early() for _ in range(6)))

    async def all_seen() -> bool:
        entry = await kit.binding(gw, "slow/up-slow")
        return bool(entry["counts"].get("cancelled") == 6)

    await kit.eventually(all_seen)
    entry = await kit.binding(gw, "slow/up-slow")
    assert (entry["state"], entry["consecutive_failures"], entry["in_flight"]) == (
        "eligible",
        0,
        0,
    )


async def test_the_gateway_out_of_files_is_never_held_against_the_upstream(
    prism_fake, prism_gateway, kit
):
    gw = await prism_gateway(kit.catalog("a", "b"))
    body = {"model": "m", "messages": MESSAGES}
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/readyz") as ready:  # the connection all calls reuse
            assert ready.status == 200
        answers = []
        with out_of_file_handles():
            for _ in range(4):  # more than the three failures that would isolate a line
                async with session.post(gw.base_url + "/chat/completions", json=body) as response:
                    answers.append((response.status, dict(response.headers), await response.json()))
        for status, headers, error in answers:
            assert status == 503
            assert error["error"]["code"] == "gateway_out_of_resources"
            # Not retried (the upstream never saw it); the next binding was tried.
            assert [entry.split()[:2] for entry in headers["x-prism-attempt-log"].split("; ")] == [
                ["a/up-a", "cancelled"],
                ["b/up-b", "cancelled"],
            ]
        assert prism_fake.hits("a") == prism_fake.hits("b") == 0
        for binding in ("a/up-a", "b/up-b"):
            entry = await kit.binding(gw, binding)
            assert (entry["state"], entry["consecutive_failures"], entry["in_flight"]) == (
                "eligible",
                0,
                0,
            )
            assert entry["window"]["calls"] == 0
        async with session.get(gw.url + "/prism/stats") as response:  # said, and counted
            assert (await response.json())["counters"]["gateway_out_of_resources"] == 8
        async with session.post(gw.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200  # files again: served by the first line, as before
            assert response.headers["x-prism-provider"] == "a"


async def test_slow_first_tokens_trip_the_latency_policy(prism_fake, prism_gateway, kit):
    # Real time: first_byte_ms is measured on the gateway's clock.
    gw = await prism_gateway(
        kit.catalog("lagging", "ok"),
        sections={
            "breaker": {
                "policies": "latency",
                "latency_min_samples": 5,
                "latency_min_slow": 1,
                "latency_sustain_s": 0,
            }
        },
    )
    for _ in range(5):
        assert (await kit.chat(gw, stream=True)).provider == "lagging"
    prism_fake.script("lagging", [Fault(first_token_delay_s=0.4)])
    slow = await kit.chat(gw, stream=True)
    assert slow.provider == "lagging"  # served: slowness is judged, not fatal
    entry = await kit.binding(gw, "lagging/up-lagging")
    assert entry["state"] == "isolated"
    assert entry["cause"].startswith("stream first-byte latency over 3x its median")
    assert entry["first_byte_ms"]["stream"]["samples"] == 6
    assert (await kit.chat(gw, stream=True)).provider == "ok"


async def test_health_lists_every_binding_with_its_numbers(prism_fake, prism_gateway, kit):
    prism_fake.script("dead", [Fault(status=500)] * 3)
    gw = await prism_gateway(kit.catalog("dead", "ok"))
    for _ in range(3):
        await kit.chat(gw, stream=True)
    health = await kit.health(gw)
    dead, ok = health["bindings"]
    assert dead["binding"] == "dead/up-dead" and dead["used_by"] == ["m"]
    assert dead["state"] == "isolated" and dead["assessment"] == "unavailable"
    assert dead["cause"] == "3 consecutive failures (transient 500: upstream 500)"
    assert dead["isolated_until"] is not None and dead["since"].endswith("Z")
    assert dead["counts"] == {"transient": 3, "stale_ignored": 0}
    assert ok["state"] == "eligible" and ok["assessment"] == "uncertain"
    assert ok["window"] == {"seconds": 60.0, "calls": 3, "failures": 0, "error_rate": 0.0}
    latency = ok["first_byte_ms"]["stream"]
    assert latency["samples"] == 3 and 0 < latency["p50"] <= latency["p95"]
    assert health["store"]["where"].startswith("memory")


async def test_plugin_is_loaded_through_its_entry_point(prism_fake, prism_gateway, kit):
    gw = await prism_gateway(kit.catalog("ok"))
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/readyz") as response:
            assert "breaker" in (await response.json())["plugins"]
