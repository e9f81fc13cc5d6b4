"""The gateway's clock: a manual one moves deadlines, retry pauses and the stream watchdog."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from prism_fake_upstream import Fault

from prism_proxy import Clock, LoopClock, ManualClock
from prism_proxy.clock import split_clock
from prism_proxy.testing import eventually

MESSAGES = [{"role": "user", "content": "hello"}]


async def test_a_manual_clock_runs_each_timer_at_its_own_time_in_order():
    clock = ManualClock(start=100.0)
    ran: list[tuple[str, float]] = []
    clock.call_at(100.5, lambda name: ran.append((name, clock.now())), "b")
    clock.call_at(100.2, lambda name: ran.append((name, clock.now())), "a")
    clock.call_at(100.3, lambda: ran.append(("dropped", clock.now()))).cancel()
    clock.advance(0.1)
    assert ran == []
    assert clock.pending == [100.2, 100.5]
    clock.advance(1.0)
    assert ran == [("a", 100.2), ("b", 100.5)]
    assert clock.now() == 101.1
    assert clock.pending == []
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


async def test_a_manual_pause_passes_at_once_and_runs_the_timers_due_meanwhile():
    clock = ManualClock()
    ran: list[float] = []
    clock.call_at(1002.0, lambda: ran.append(clock.now()))
    await clock.sleep(5)
    await clock.sleep(-1)  # as asyncio.sleep: no pause, and no time going back
    assert ran == [1002.0]
    assert clock.now() == 1005.0
    assert clock.slept == [5, -1]
    # A timer already due runs soon, as loop.call_at's does.
    clock.call_at(clock.now() - 1, lambda: ran.append(-1.0))
    await asyncio.sleep(0)
    assert ran == [1002.0, -1.0]


def test_both_clocks_are_clocks():
    assert isinstance(LoopClock(), Clock)
    assert isinstance(ManualClock(), Clock)
    assert not isinstance(lambda: 0.0, Clock)  # the older injection: a bare time source


def test_a_bare_time_source_and_pause_are_still_honoured_with_real_timers():
    class Pauses(list[float]):  # a recorder: callable, and empty (falsy) at first
        async def __call__(self, seconds: float) -> None:
            self.append(seconds)

    pauses = Pauses()
    timers, now, pause = split_clock(lambda: 5.0, pauses)
    assert (isinstance(timers, LoopClock), now(), pause) == (True, 5.0, pauses)
    manual = ManualClock()
    assert split_clock(manual, None) == (manual, manual.now, manual.sleep)
    assert split_clock(manual, pauses)[2] is pauses


def catalog(fake: Any, *scenarios: str, **model: Any) -> dict[str, Any]:
    return {
        "providers": {s: {"kind": "openai", "base_url": fake.base_url(s)} for s in scenarios},
        "models": {
            "m": {"chain": [{"provider": s, "model": f"up-{s}"} for s in scenarios], **model}
        },
    }


async def test_deadlines_and_the_stream_watchdog_keep_the_injected_clock(
    prism_fake, prism_gateway, prism_clock, recorder
):
    # Timeouts of two minutes, passed in no real time: the attempt's deadline
    # and the watchdog of the stream that then goes silent take the gateway's
    # clock, not the loop's.
    prism_fake.clock = prism_clock
    prism_fake.script("stall", [Fault(stall_s=600)])
    prism_fake.script("quiet", [Fault(token_delay_s=600)])
    gw = await prism_gateway(
        catalog(prism_fake, "stall", "quiet", retries=0),
        config={"attempt_timeout_ms": 120_000, "call_budget_ms": 600_000},
        clock=prism_clock,
    )
    async with aiohttp.ClientSession() as session, asyncio.timeout(10):
        answer = asyncio.ensure_future(
            session.post(
                gw.base_url + "/chat/completions",
                json={"model": "m", "messages": MESSAGES, "stream": True},
            )
        )
        await eventually(lambda: prism_fake.hits("stall") == 1)
        prism_clock.advance(119.9)
        assert gw.gateway.current.deadlines.pending == 1  # never early
        prism_clock.advance(0.2)  # kept up to a tenth of a second late
        async with await answer as response:  # "quiet" committed: its first event
            assert (await response.content.readuntil(b"\n\n")).startswith(b"data: {")
            await eventually(lambda: prism_clock.now() + 120 in prism_clock.pending)
            prism_clock.advance(120)  # the watchdog, armed when the read began
            body = await response.read()
    assert response.headers["x-prism-provider"] == "quiet"
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e]
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    assert "silent for 120 s" in events[-1]["error"]["message"]
    stalled, quiet = recorder.attempts
    assert (str(stalled.verdict.outcome), quiet.binding.provider) == ("timeout", "quiet")
    assert 120_000 <= round(stalled.elapsed_ms) <= 120_100
    await eventually(lambda: prism_fake.dropped("quiet") == 1)  # the silent upstream is dropped
