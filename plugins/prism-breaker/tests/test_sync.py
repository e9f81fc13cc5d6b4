"""The breaker's background half by itself (``prism_breaker.sync``): writing transitions,
adopting what others recorded, exchanging evidence with a fleet, ending expired caps.

No server: a breaker on a recording store (and fleet), the clock moved by hand.
"""

from __future__ import annotations

import asyncio

import pytest
from prism_breaker import State

from prism_proxy import BindingRecord, FleetView, Outcome, Override

from .conftest import (
    FakeTime,
    RecordingFleet,
    RecordingStore,
    attempt,
    isolate,
    unit_breaker,
    unit_call,
)


async def test_a_failed_write_keeps_the_transitions_for_the_next(fake_time: FakeTime) -> None:
    store = RecordingStore(fail_writes=1)
    breaker = unit_breaker(fake_time, "a", store=store)
    isolate(breaker, "a/up-a")
    with pytest.raises(OSError, match="disk full"):
        await breaker.sync.flush()
    assert breaker.health(with_text=False)["store"]["pending_writes"] == 1
    await breaker.sync.flush()
    [written] = store.written
    assert (written.audit.from_state, written.audit.to_state) == ("eligible", "isolated")
    assert written.audit.cause == "permanent failure: permanent 401: upstream 401"
    assert written.record.isolated_until == breaker.wall.at(fake_time.now + 30.0)
    assert breaker.health(with_text=False)["store"]["pending_writes"] == 0


async def test_a_record_another_gateway_wrote_first_is_adopted(fake_time: FakeTime) -> None:
    store = RecordingStore()
    breaker = unit_breaker(fake_time, "a", store=store)
    isolate(breaker, "a/up-a")
    theirs = BindingRecord(
        binding="a/up-a",
        state="trial",
        cause="isolation window ended",
        since=breaker.wall.now(),
        revision=7,
        isolated_revision=6,
        step=0,
        isolated_until=None,
        restored_at=None,
        trial_since=breaker.wall.now(),
    )
    store.beaten = [theirs]
    await breaker.sync.flush()
    h = breaker.machine.get("a/up-a", fake_time.now)
    assert (h.state, h.revision, h.isolated_revision) == (State.TRIAL, 7, 6)


async def test_the_fleet_is_told_each_window_second_once_and_its_counts_judge(
    fake_time: FakeTime,
) -> None:
    fleet = RecordingFleet()
    breaker = unit_breaker(
        fake_time,
        "a",
        store=RecordingStore(fleet=fleet),
        policies=frozenset({"error_rate"}),
        error_rate_min_calls=20,
    )
    for outcome, status in ((Outcome.TRANSIENT, 500), (Outcome.OK, 200), (Outcome.OK, 200)):
        attempt(breaker, unit_call(), "a/up-a", outcome, status)
    await breaker.sync.refresh()
    [[report]] = fleet.reports
    assert report.window == ((int(breaker.wall.now()), 3, 1),)
    assert breaker.machine.get("a/up-a", fake_time.now).state is State.ELIGIBLE  # 3 calls
    # The others saw 17 calls with 5 failures: 6 of 20 together, over 25%.
    fleet.views["a/up-a"] = FleetView("a/up-a", calls=17, failures=5)
    await breaker.sync.refresh()
    assert fleet.reports[1][0].window == ()  # told once
    h = breaker.machine.get("a/up-a", fake_time.now)
    assert h.state is State.ISOLATED
    assert h.cause == "error rate 30% over 60 s (6/20)"


async def test_a_failed_exchange_forgets_what_the_others_said(fake_time: FakeTime) -> None:
    fleet = RecordingFleet()
    breaker = unit_breaker(fake_time, "a", store=RecordingStore(fleet=fleet))
    fleet.views["a/up-a"] = FleetView("a/up-a", calls=4, failures=1)
    await breaker.sync.refresh()
    h = breaker.machine.get("a/up-a", fake_time.now)
    assert h.errors.others == (4, 1)
    fleet.fail = True
    with pytest.raises(ConnectionError):
        await breaker.sync.refresh()
    assert h.errors.others == (0, 0)  # local evidence alone until the fleet answers


async def test_an_expired_cap_is_ended_in_the_store_once(fake_time: FakeTime) -> None:
    store = RecordingStore()
    breaker = unit_breaker(fake_time, "a", store=store)
    now = breaker.wall.now()
    expiring = Override(
        id="ovr_cap",
        kind="cap",
        scope="provider",
        target="a",
        reason="slow down",
        owner="ops",
        created_at=now,
        review_by=now + 86400 * 7,
        expires_at=now + 60,
        max_in_flight=2,
    )
    await breaker.add_override(expiring)
    await breaker.sync.refresh()
    assert "ovr_cap" in breaker.overrides.active
    fake_time.advance(60.0)
    await breaker.sync.refresh()
    await breaker.sync.refresh()
    assert not breaker.overrides.active and not store.overrides
    assert [(row.action, row.actor, row.subject) for row in store.audit_rows] == [
        ("cap", "ops", "provider:a"),
        ("expire", "breaker", "provider:a"),
    ]


async def test_the_fleet_coming_back_gets_this_gateways_state(fake_time: FakeTime) -> None:
    fleet = RecordingFleet()
    store = RecordingStore(fleet=fleet)
    breaker = unit_breaker(fake_time, "a", "b", store=store)
    running = breaker.lifecycle()
    await anext(running)  # loaded; the background task runs
    try:
        isolate(breaker, "b/up-b")
        assert fleet.callbacks is not None
        _, back = fleet.callbacks
        back()
        async with asyncio.timeout(5):
            await fleet.republished_event.wait()
        [(records, overrides)] = fleet.republished
        assert {r.binding: r.state for r in records} == {"a/up-a": "eligible", "b/up-b": "isolated"}
        assert overrides == []
    finally:
        with pytest.raises(StopAsyncIteration):
            await anext(running)
    assert [t.record.binding for t in store.written] == ["b/up-b"]  # flushed before stopping
