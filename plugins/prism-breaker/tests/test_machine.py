"""The state machine driven directly with an explicit clock: thresholds, hysteresis, identity."""

from __future__ import annotations

import pytest
from prism_breaker import Admission, Machine, Observation, Settings, State

from prism_proxy import Outcome

KEY = "p/m"
NEVER_COUNTED = [Outcome.RATE_LIMITED, Outcome.REQUEST_ERROR, Outcome.CANCELLED, Outcome.EMPTY]


def make(**settings: object) -> Machine:
    return Machine(Settings(**settings))  # type: ignore[arg-type]


def see(m: Machine, outcome: Outcome, now: float, **kw: object) -> State:
    """Observe one attempt that started under the binding's current revision."""
    revision = m.get(KEY, now).revision
    m.observe(KEY, Observation(outcome, revision, **kw), now)  # type: ignore[arg-type]
    return m.get(KEY, now).state


def trip(m: Machine, now: float) -> None:
    see(m, Outcome.PERMANENT, now, reason="marker: insufficient_quota")
    assert m.get(KEY, now).state is State.ISOLATED


def to_trial(m: Machine, now: float) -> float:
    """Trip, wait out the window, take the slot; returns the time the trial began."""
    trip(m, now)
    start = m.get(KEY, now).isolated_until
    assert start is not None
    assert m.admit(KEY, start).trial_token is not None
    assert m.get(KEY, start).state is State.TRIAL
    return start


# -- consecutive failures ------------------------------------------------------


@pytest.mark.parametrize("threshold", [3, 5])
def test_consecutive_trips_exactly_at_the_threshold(threshold: int) -> None:
    m = make(policies=frozenset({"consecutive"}), consecutive_failures=threshold)
    for n in range(1, threshold):
        assert see(m, Outcome.TRANSIENT, 10.0 + n) is not State.ISOLATED, n
    assert see(m, Outcome.TIMEOUT, 100.0) is State.ISOLATED
    b = m.get(KEY, 100.0)
    assert b.cause.startswith(f"{threshold} consecutive failures")
    assert b.isolated_until == 130.0  # 30 s isolation


def test_a_success_resets_the_consecutive_count() -> None:
    m = make(policies=frozenset({"consecutive"}))
    for outcome in [Outcome.TRANSIENT, Outcome.TRANSIENT, Outcome.OK] * 5:
        assert see(m, outcome, 1.0) is not State.ISOLATED
    assert see(m, Outcome.BROKEN_STREAM, 1.0) is State.ELIGIBLE
    assert see(m, Outcome.BROKEN_STREAM, 1.0) is State.SUSPECT  # half-way: watched
    assert see(m, Outcome.BROKEN_STREAM, 1.0) is State.ISOLATED  # pre-commit breaks count


def test_a_permanent_failure_isolates_at_once() -> None:
    m = make()
    assert see(m, Outcome.PERMANENT, 5.0, reason="marker: invalid_api_key") is State.ISOLATED
    assert "invalid_api_key" in m.get(KEY, 5.0).cause


@pytest.mark.parametrize("outcome", NEVER_COUNTED)
def test_rate_limits_request_errors_cancellations_and_empties_never_trip(
    outcome: Outcome,
) -> None:
    m = make(error_rate_min_calls=1, latency_min_samples=1)
    for n in range(500):
        assert see(m, outcome, float(n) / 10) is State.ELIGIBLE
    b = m.get(KEY, 50.0)
    assert (b.consecutive, b.errors.calls, b.counts[str(outcome)]) == (0, 0, 500)


# -- error rate ------------------------------------------------------------------


def test_error_rate_trips_on_the_first_call_above_the_threshold() -> None:
    m = make(policies=frozenset({"error_rate"}), error_rate=0.25, error_rate_min_calls=20)
    for n in range(15):
        see(m, Outcome.OK, 1.0 + n)
    for n in range(5):  # 5/20 = 25 %: at the threshold is not above it
        assert see(m, Outcome.TRANSIENT, 20.0 + n) is not State.ISOLATED
    assert see(m, Outcome.TRANSIENT, 30.0) is State.ISOLATED  # 6/21 = 28.6 %
    assert m.get(KEY, 30.0).cause == "error rate 29% over 60 s (6/21)"


def test_error_rate_waits_for_the_minimum_number_of_calls() -> None:
    m = make(policies=frozenset({"error_rate"}), error_rate=0.25, error_rate_min_calls=20)
    for n in range(10):
        see(m, Outcome.OK, 1.0 + n * 0.1)
    for n in range(9):  # 9/19 = 47 %, but only 19 calls
        assert see(m, Outcome.TIMEOUT, 2.0 + n * 0.1) is not State.ISOLATED
    assert see(m, Outcome.TIMEOUT, 3.0) is State.ISOLATED  # the 20th call


def test_error_rate_forgets_failures_older_than_the_window() -> None:
    m = make(policies=frozenset({"error_rate"}), error_rate_min_calls=4, error_rate_window_s=60)
    for n in range(3):
        see(m, Outcome.TRANSIENT, 0.0 + n)
    # 61 s later the old failures are gone: 1 failure in 4 calls is 25 %, not above.
    for n in range(3):
        see(m, Outcome.OK, 61.0 + n)
    assert see(m, Outcome.TRANSIENT, 65.0) is not State.ISOLATED


# -- latency ------------------------------------------------------------------------


def latency_machine(**extra: object) -> Machine:
    return make(
        policies=frozenset({"latency"}),
        latency_factor=3.0,
        latency_sustain_s=60.0,
        latency_min_samples=20,
        latency_min_slow=5,
        **extra,
    )


def baseline(m: Machine, count: int = 20, ms: float = 100.0) -> None:
    for n in range(count):
        see(m, Outcome.OK, float(n), streaming=True, first_byte_ms=ms)


def test_latency_trips_when_slowness_has_lasted_the_sustain_period() -> None:
    m = latency_machine()
    baseline(m)
    for i, t in enumerate((100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 159.9)):
        state = see(m, Outcome.OK, t, streaming=True, first_byte_ms=400.0)
        # Half-way (3 of the 5 slow answers a trip needs) is suspect; not 60 s yet.
        assert state is (State.SUSPECT if i >= 2 else State.ELIGIBLE), t
    assert see(m, Outcome.OK, 160.0, streaming=True, first_byte_ms=400.0) is State.ISOLATED
    assert "over 3x its median (100 ms) for 60 s" in m.get(KEY, 160.0).cause


def test_latency_at_exactly_k_times_the_median_is_not_slow() -> None:
    m = latency_machine()
    baseline(m)
    for t in range(100, 300, 10):
        assert see(m, Outcome.OK, float(t), streaming=True, first_byte_ms=300.0) is State.ELIGIBLE


def test_one_normal_sample_ends_a_slow_run() -> None:
    m = latency_machine()
    baseline(m)
    for t in (100.0, 110.0, 120.0, 130.0, 140.0, 150.0):
        see(m, Outcome.OK, t, streaming=True, first_byte_ms=400.0)
    assert see(m, Outcome.OK, 155.0, streaming=True, first_byte_ms=110.0) is State.ELIGIBLE
    for t in (161.0, 162.0):
        assert see(m, Outcome.OK, t, streaming=True, first_byte_ms=400.0) is State.ELIGIBLE
    assert see(m, Outcome.OK, 163.0, streaming=True, first_byte_ms=400.0) is State.SUSPECT


def test_a_slow_answer_now_and_then_never_makes_a_line_suspect() -> None:
    m = latency_machine()
    baseline(m)
    moves = len(m.outbox)
    for n in range(200):  # every fifth answer slow: jitter, not a slow line
        slow = n % 5 == 0
        state = see(
            m, Outcome.OK, 100.0 + n, streaming=True, first_byte_ms=400.0 if slow else 100.0
        )
        assert state is State.ELIGIBLE, n
    assert len(m.outbox) == moves  # not one transition to store, audit or publish


def test_latency_needs_enough_baseline_samples_and_slow_samples() -> None:
    m = latency_machine()
    baseline(m, count=19)  # one short of a judgeable median: the next sample is not judged
    assert see(m, Outcome.OK, 100.0, streaming=True, first_byte_ms=5000.0) is State.ELIGIBLE
    assert m.get(KEY, 100.0).latency["stream"].slow_since is None
    m = latency_machine()
    baseline(m)
    for t in (100.0, 101.0):
        see(m, Outcome.OK, t, streaming=True, first_byte_ms=400.0)
    # 70 s later, but only the 3rd slow sample of the run (5 are needed).
    assert see(m, Outcome.OK, 170.0, streaming=True, first_byte_ms=400.0) is State.SUSPECT


def test_whole_body_latency_does_not_trip_unless_asked() -> None:
    m = latency_machine()
    for n in range(20):
        see(m, Outcome.OK, float(n), first_byte_ms=100.0)
    for t in range(100, 400, 10):
        assert see(m, Outcome.OK, float(t), first_byte_ms=5000.0) is State.ELIGIBLE
    m = latency_machine(latency_whole_body=True)
    for n in range(20):
        see(m, Outcome.OK, float(n), first_byte_ms=100.0)
    states = [see(m, Outcome.OK, float(t), first_byte_ms=5000.0) for t in range(100, 170, 10)]
    assert states[-1] is State.ISOLATED


# -- isolation, trial, hysteresis -------------------------------------------------------


def test_isolation_backs_off_exponentially_up_to_the_cap() -> None:
    m = make()
    now = 0.0
    trip(m, now)
    windows = []
    for _ in range(7):
        b = m.get(KEY, now)
        assert b.isolated_until is not None
        windows.append(b.isolated_until - now)
        now = b.isolated_until
        assert m.admit(KEY, now).trial_token is not None
        assert see(m, Outcome.TRANSIENT, now) is State.ISOLATED  # a trial failure: next step
    assert windows == [30, 60, 120, 240, 480, 900, 900]


def test_the_backoff_starts_over_after_a_long_quiet_spell() -> None:
    m = make(trial_min_successes=1, trial_min_duration_s=0)
    start = to_trial(m, 0.0)
    see(m, Outcome.OK, start)
    assert m.get(KEY, start).state is State.ELIGIBLE
    trip(m, start + 100)  # soon after restoring: the next step
    assert m.get(KEY, start + 100).isolated_until == start + 100 + 60
    start = m.get(KEY, start + 100).isolated_until
    assert start is not None
    m.admit(KEY, start)
    see(m, Outcome.OK, start)
    trip(m, start + 901)  # after 15 quiet minutes: from the start
    assert m.get(KEY, start + 901).isolated_until == start + 901 + 30


def test_restoring_needs_enough_successes_over_enough_time() -> None:
    m = make(trial_min_successes=5, trial_min_duration_s=60, trial_spacing_s=0)
    start = to_trial(m, 0.0)
    for n in range(10):  # ten successes in 9 s: plenty of count, too little time
        assert see(m, Outcome.OK, start + n) is State.TRIAL
    assert see(m, Outcome.OK, start + 59.9) is State.TRIAL
    assert see(m, Outcome.OK, start + 60) is State.ELIGIBLE
    assert m.get(KEY, start + 60).cause == "trial passed: 12 successes over 60 s"


def test_time_alone_never_restores() -> None:
    m = make(trial_min_successes=5, trial_min_duration_s=60, trial_spacing_s=0)
    start = to_trial(m, 0.0)
    for n in range(4):
        see(m, Outcome.OK, start + n)
    b = m.tick(KEY, start + 10_000)
    assert b.state is State.TRIAL
    assert m.assessment(b, start + 10_000) == "uncertain"
    assert see(m, Outcome.OK, start + 10_001) is State.ELIGIBLE  # the 5th success


def test_a_failure_in_trial_isolates_again_at_the_next_step() -> None:
    m = make()
    start = to_trial(m, 0.0)
    see(m, Outcome.OK, start)
    assert see(m, Outcome.TIMEOUT, start + 5) is State.ISOLATED
    assert m.get(KEY, start + 5).isolated_until == start + 5 + 60
    assert m.get(KEY, start + 5).cause.startswith("trial failed: timeout")


def test_a_slow_trial_success_counts_as_a_trial_failure() -> None:
    m = make(latency_min_samples=3)
    for n in range(3):
        see(m, Outcome.OK, float(n), streaming=True, first_byte_ms=100.0)
    start = to_trial(m, 10.0)
    assert see(m, Outcome.OK, start, streaming=True, first_byte_ms=900.0) is State.ISOLATED
    assert m.get(KEY, start).cause.startswith("trial too slow")


def test_one_trial_slot_among_fifty_concurrent_callers() -> None:
    m = make(trial_max_in_flight=1, trial_spacing_s=1.0)
    trip(m, 0.0)
    admissions = [m.admit(KEY, 30.0) for _ in range(50)]
    holders = [a for a in admissions if a.admitted]
    assert len(holders) == 1 and holders[0].trial_token is not None
    assert {a.reason for a in admissions if not a.admitted} == {"breaker: trial in progress"}
    # Released, but the window moved at hand-out: still nobody until it passes.
    m.release(KEY, holders[0].trial_token)
    assert not m.admit(KEY, 30.5).admitted
    assert m.admit(KEY, 31.0).admitted


def test_the_trial_ceiling_is_absolute() -> None:
    m = make(trial_max_in_flight=2, trial_spacing_s=0.0)
    trip(m, 0.0)
    granted = [m.admit(KEY, 30.0 + n * 0.01) for n in range(100)]
    assert sum(a.admitted for a in granted) == 2


def test_an_abandoned_trial_slot_is_reclaimed_after_its_lease() -> None:
    m = make(trial_lease_s=120.0, trial_spacing_s=1.0)
    trip(m, 0.0)
    assert m.admit(KEY, 30.0).admitted  # the holder vanishes without a word
    assert not m.admit(KEY, 149.0).admitted
    assert m.admit(KEY, 150.0).admitted


# -- attempt identity -------------------------------------------------------------------


def test_a_late_completion_from_before_an_isolation_is_ignored() -> None:
    m = make(trial_min_successes=1, trial_min_duration_s=0)
    old_revision = m.get(KEY, 0.0).revision  # a slow attempt starts here...
    trip(m, 1.0)  # ...other attempts isolate the binding...
    assert m.admit(KEY, 31.0).admitted  # ...the window ends and a trial begins...
    late = Observation(Outcome.OK, old_revision, attempt_id="att_late")
    assert m.observe(KEY, late, 32.0) is None  # ...then the old attempt succeeds.
    b = m.get(KEY, 32.0)
    assert (b.state, b.trial_successes, b.stale) == (State.TRIAL, 0, 1)
    late_failure = Observation(Outcome.TRANSIENT, old_revision)
    assert m.observe(KEY, late_failure, 33.0) is None
    assert m.get(KEY, 33.0).state is State.TRIAL  # nor does a late failure re-isolate
    assert see(m, Outcome.OK, 34.0) is State.ELIGIBLE  # a trial attempt does count


def test_stand_down_attempts_started_while_isolated_are_not_trial_evidence() -> None:
    m = make(trial_min_successes=1, trial_min_duration_s=0)
    trip(m, 0.0)
    during_isolation = m.get(KEY, 10.0).revision
    m.admit(KEY, 30.0)
    m.observe(KEY, Observation(Outcome.OK, during_isolation), 31.0)
    assert m.get(KEY, 31.0).state is State.TRIAL


def test_admission_right_after_a_trip_or_a_failed_trial_refuses_the_retry() -> None:
    # What the plugin's prism_admit_attempt asks before the dispatch loop retries.
    m = make(policies=frozenset({"consecutive"}))
    for _ in range(2):
        see(m, Outcome.TRANSIENT, 0.0)
        assert m.admit(KEY, 0.0).admitted  # not yet: a retry may go ahead
    see(m, Outcome.TRANSIENT, 0.0)
    assert m.admit(KEY, 0.0) == Admission(False, "breaker: isolated")
    token = m.admit(KEY, 30.0).trial_token
    assert token is not None
    see(m, Outcome.TRANSIENT, 30.0)  # the trial attempt fails...
    m.release(KEY, token)
    assert m.admit(KEY, 30.0) == Admission(False, "breaker: isolated")  # ...no retry


def test_assessment_is_uncertain_until_there_is_enough_traffic() -> None:
    m = make(error_rate_min_calls=20)
    b = m.get(KEY, 0.0)
    assert m.assessment(b, 0.0) == "uncertain"
    for n in range(19):
        see(m, Outcome.OK, float(n))
    assert m.assessment(b, 19.0) == "uncertain"
    see(m, Outcome.OK, 19.5)
    assert m.assessment(b, 19.5) == "healthy"
    assert m.assessment(b, 200.0) == "uncertain"  # the window emptied: no longer known


def test_every_transition_is_queued_with_evidence_and_revision() -> None:
    m = make(trial_min_successes=1, trial_min_duration_s=0)
    start = to_trial(m, 0.0)
    see(m, Outcome.OK, start)
    moves = [(t.from_state, t.to_state, t.revision) for t in m.outbox]
    assert moves == [
        (State.ELIGIBLE, State.ISOLATED, 1),
        (State.ISOLATED, State.TRIAL, 2),
        (State.TRIAL, State.ELIGIBLE, 3),
    ]
    isolation = m.outbox[0]
    assert isolation.evidence["consecutive_failures"] == 1
    assert isolation.evidence["isolation_s"] == 30
    assert isolation.snapshot.isolated_revision == 1


def test_first_bytes_under_the_floor_are_never_slow_whatever_the_median() -> None:
    # A fast upstream (1 ms) behind a gateway queueing under load (15 ms): not slow.
    m = latency_machine(latency_floor_ms=100.0)
    baseline(m, ms=1.0)
    for t in range(100, 300):
        assert see(m, Outcome.OK, float(t), streaming=True, first_byte_ms=15.0) is State.ELIGIBLE
    # Above the floor and above 3x the median it is slow as before.
    for t in range(300, 303):
        see(m, Outcome.OK, float(t), streaming=True, first_byte_ms=400.0)
    assert m.get(KEY, 303.0).state is State.SUSPECT
