"""The breaker's per-call half by itself (``prism_breaker.admission``): which lines a call
may try, the trial slot, caps, the ramp, and which attempts count as evidence.

No server: a breaker over a small catalog, the clock moved by hand.
"""

from __future__ import annotations

from prism_breaker import State

from prism_proxy import Outcome, Override, Verdict

from .conftest import FakeTime, attempt, isolate, route_of, unit_breaker, unit_call


def cap(target: str, max_in_flight: int) -> Override:
    return Override(
        id="ovr_cap",
        kind="cap",
        scope="binding",
        target=target,
        reason="slow down",
        owner="ops",
        created_at=0.0,
        review_by=4e9,
        max_in_flight=max_in_flight,
    )


def quarantine(target: str) -> Override:
    return Override(
        id="ovr_q",
        kind="quarantine",
        scope="binding",
        target=target,
        reason="looking",
        owner="ops",
        created_at=0.0,
        review_by=4e9,
    )


def test_an_isolated_line_is_skipped_and_the_rest_of_the_route_stays(
    fake_time: FakeTime,
) -> None:
    breaker = unit_breaker(fake_time, "a", "b")
    isolate(breaker, "a/up-a")
    call, route = unit_call(), route_of(breaker)
    breaker.admission.select(call, route)
    assert [b.id for b in route.bindings] == ["b/up-b"]
    assert [(b.id, why) for b, why in route.skipped] == [("a/up-a", "breaker: isolated")]
    assert "x-prism-breaker" not in call.response_headers and not route.notes


def test_when_every_line_is_out_it_stands_down_and_a_quarantine_still_holds(
    fake_time: FakeTime,
) -> None:
    breaker = unit_breaker(fake_time, "a", "b", "c")
    isolate(breaker, "a/up-a")
    isolate(breaker, "c/up-c")
    breaker.overrides.add(quarantine("b/up-b"))
    call, route = unit_call(), route_of(breaker)
    breaker.admission.select(call, route)
    assert [b.id for b in route.bindings] == ["a/up-a", "c/up-c"]
    assert [(b.id, why) for b, why in route.skipped] == [("b/up-b", "breaker: quarantined (ovr_q)")]
    assert route.notes == ["breaker: every binding is out; standing down, trying them all"]
    assert call.response_headers["x-prism-breaker"] == "stand-down"
    assert breaker.counters["breaker_stand_down"] == 1
    # The stand-down's lines get their first try; a retry of one that failed does not.
    assert breaker.admission.admit_attempt(call, breaker.catalog.bindings["a/up-a"]) is None
    attempt(breaker, call, "a/up-a", Outcome.TRANSIENT, 500)
    assert breaker.admission.admit_attempt(call, breaker.catalog.bindings["a/up-a"]) == (
        "breaker: isolated"
    )
    assert breaker.admission.admit_attempt(call, breaker.catalog.bindings["b/up-b"]) == (
        "breaker: quarantined (ovr_q)"
    )


def test_the_trial_slot_goes_to_one_call_and_comes_back_when_it_settles(
    fake_time: FakeTime,
) -> None:
    breaker = unit_breaker(fake_time, "a", "b", isolation_s=30.0, trial_spacing_s=1.0)
    isolate(breaker, "a/up-a")
    fake_time.advance(30.0)
    first, second = unit_call(), unit_call()
    first_route, second_route = route_of(breaker), route_of(breaker)
    breaker.admission.select(first, first_route)
    breaker.admission.select(second, second_route)
    assert [b.id for b in first_route.bindings] == ["a/up-a", "b/up-b"]  # holds the slot
    assert [(b.id, why) for b, why in second_route.skipped] == [
        ("a/up-a", "breaker: trial in progress")
    ]
    assert breaker.admission.admit_attempt(first, breaker.catalog.bindings["a/up-a"]) is None
    trial = attempt(breaker, first, "a/up-a", Outcome.OK, 200)
    assert first.response_headers["x-prism-breaker"] == "trial a/up-a"
    assert breaker.machine.get("a/up-a", fake_time.now).leases  # served: held until settle
    breaker.admission.settle(first, None)  # the breaker reads no settlement
    assert not breaker.machine.get("a/up-a", fake_time.now).leases
    assert trial.extensions["breaker"].trial_token is None
    fake_time.advance(1.0)  # trial_spacing_s: the next slot opens
    third, third_route = unit_call(), route_of(breaker)
    breaker.admission.select(third, third_route)
    assert [b.id for b in third_route.bindings] == ["a/up-a", "b/up-b"]


def test_a_restored_line_takes_a_growing_share_of_calls(fake_time: FakeTime) -> None:
    draws = iter([0.5, 0.5])
    breaker = unit_breaker(
        fake_time,
        "a",
        "b",
        random=lambda: next(draws),
        ramp_s=30.0,
        trial_min_successes=1,
        trial_min_duration_s=0.0,
    )
    isolate(breaker, "a/up-a")
    fake_time.advance(30.0)
    call = unit_call()
    breaker.admission.select(call, route_of(breaker))
    attempt(breaker, call, "a/up-a", Outcome.OK, 200)
    assert breaker.machine.get("a/up-a", fake_time.now).state is State.ELIGIBLE
    fake_time.advance(1.5)  # 5% of the ramp: the floor, 10% of calls
    route = route_of(breaker)
    breaker.admission.select(unit_call(), route)
    assert [(b.id, why) for b, why in route.skipped] == [
        ("a/up-a", "breaker: ramping up (10% of calls)")
    ]
    fake_time.advance(16.5)  # 60% of the ramp: a draw of 0.5 is taken
    route = route_of(breaker)
    breaker.admission.select(unit_call(), route)
    assert not route.skipped
    fake_time.advance(12.0)  # the ramp is over: no draw at all (the iterator is spent)
    route = route_of(breaker)
    breaker.admission.select(unit_call(), route)
    assert not route.skipped


def test_a_cap_vetoes_the_attempt_that_would_exceed_it_until_one_ends(
    fake_time: FakeTime,
) -> None:
    breaker = unit_breaker(fake_time, "a", "b")
    breaker.overrides.add(cap("a/up-a", 1))
    a = breaker.catalog.bindings["a/up-a"]
    first, second = unit_call(), unit_call()
    assert breaker.admission.admit_attempt(first, a) is None
    running = first.new_attempt(a, fake_time.now)
    breaker.admission.attempt_start(first, running)
    assert breaker.admission.admit_attempt(second, a) == "breaker: cap 1 reached (ovr_cap)"
    running.verdict = Verdict(Outcome.TRANSIENT, "upstream 500")
    breaker.admission.on_attempt(first, running)  # a failed attempt stops counting in flight
    assert breaker.admission.admit_attempt(second, a) is None


def test_only_customers_attempts_under_the_current_line_are_evidence(
    fake_time: FakeTime,
) -> None:
    breaker = unit_breaker(fake_time, "a", consecutive_failures=1)
    a = breaker.catalog.bindings["a/up-a"]
    for _ in range(3):
        attempt(breaker, unit_call(traffic="probe"), "a/up-a", Outcome.TRANSIENT, 500)
    assert breaker.machine.get("a/up-a", fake_time.now).state is State.ELIGIBLE
    call = unit_call()
    stale = call.new_attempt(a, fake_time.now)
    breaker.admission.attempt_start(call, stale)
    stale.verdict = Verdict(Outcome.TRANSIENT, "upstream 500")
    breaker.admission.on_attempt(call, stale, evidence=False)  # an older generation's line
    assert breaker.counters["breaker_stale_evidence"] == 1
    assert breaker.machine.get("a/up-a", fake_time.now).state is State.ELIGIBLE
    assert breaker.machine.get("a/up-a", fake_time.now).in_flight == 0
    attempt(breaker, unit_call(), "a/up-a", Outcome.TRANSIENT, 500)
    assert breaker.machine.get("a/up-a", fake_time.now).state is State.ISOLATED
