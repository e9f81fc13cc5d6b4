"""What the machine does with a fleet's evidence: the others' counts, states and medians."""

from __future__ import annotations

from prism_breaker import Machine, Observation, Settings, State
from prism_breaker.trackers import LatencyTrack

from prism_proxy import Outcome

KEY = "p/m"


def fleet_machine(**settings: object) -> Machine:
    return Machine(Settings(**settings), fleet=True)  # type: ignore[arg-type]


def see(m: Machine, outcome: Outcome, now: float) -> None:
    m.observe(KEY, Observation(outcome, m.get(KEY, now).revision), now)


def test_the_error_rate_judges_our_counts_and_the_others_together() -> None:
    m = fleet_machine(policies=frozenset({"error_rate"}), error_rate_min_calls=20)
    for i in range(5):
        see(m, Outcome.TRANSIENT if i % 2 == 0 else Outcome.OK, 1.0)
    b = m.get(KEY, 1.0)
    assert (b.errors.calls, b.errors.failures) == (5, 3)
    assert len(b.errors.unsent or []) == 5  # to be reported to the others
    assert m.judge(KEY, 1.0) is None  # 5 calls: too few to judge
    b.errors.others = (15, 3)  # the other gateways' share: 6 failures in 20 calls
    transition = m.judge(KEY, 1.0)
    assert transition is not None and transition.to_state is State.ISOLATED
    assert transition.cause == "error rate 30% over 60 s (6/20)"
    assert b.errors.others == (0, 0) and not b.errors.unsent  # a fresh window after a trip


def test_others_lacking_our_evidence_never_clear_our_suspicion() -> None:
    m = fleet_machine(policies=frozenset({"consecutive"}), consecutive_failures=4)
    see(m, Outcome.TRANSIENT, 1.0)
    see(m, Outcome.TRANSIENT, 1.0)
    assert m.get(KEY, 1.0).state is State.SUSPECT
    assert m.judge(KEY, 2.0) is None
    assert m.get(KEY, 2.0).state is State.SUSPECT
    see(m, Outcome.OK, 3.0)  # our own success does clear it
    assert m.get(KEY, 3.0).state is State.ELIGIBLE


def test_an_isolation_adopted_from_the_fleet_clears_our_evidence_and_sets_the_revision() -> None:
    m, other = fleet_machine(), fleet_machine()
    see(m, Outcome.TRANSIENT, 1.0)
    see(other, Outcome.PERMANENT, 1.0)  # another gateway isolates
    snap = other.get(KEY, 1.0).snapshot()
    assert m.adopt(snap, 1.5)
    b = m.get(KEY, 1.5)
    assert (b.state, b.revision, b.isolated_revision) == (State.ISOLATED, 1, 1)
    assert b.consecutive == 0 and b.errors.calls == 0
    assert not m.adopt(snap, 2.0)  # not newer: nothing to do
    assert not m.admit(KEY, 2.0).admitted
    # A late completion of an attempt that started before the adopted isolation is stale.
    m.observe(KEY, Observation(Outcome.TRANSIENT, 0), 2.0)
    assert b.stale == 1


def test_a_trial_adopted_twice_keeps_its_successes_and_a_new_one_starts_at_zero() -> None:
    settings = {"trial_min_successes": 5, "trial_min_duration_s": 0.0, "isolation_s": 10.0}
    m, other = fleet_machine(**settings), fleet_machine(**settings)
    see(other, Outcome.PERMANENT, 0.0)
    other.tick(KEY, 20.0)  # its isolation window ended: trial, revision 2
    trial = other.get(KEY, 20.0).snapshot()
    assert trial.state is State.TRIAL
    assert m.adopt(trial, 20.0)
    b = m.get(KEY, 20.0)
    b.trial_successes = 3
    assert not m.adopt(trial, 21.0)  # the same trial: its evidence stays
    assert b.trial_successes == 3
    # The fleet counted five successes in all: the trial passes on the fleet's count.
    b.trial_successes = 5
    transition = m.judge(KEY, 22.0)
    assert transition is not None and transition.to_state is State.ELIGIBLE


def test_a_refused_transition_adopts_the_stored_record_even_at_the_same_revision() -> None:
    m, other = fleet_machine(), fleet_machine()
    see(m, Outcome.PERMANENT, 1.0)  # ours: isolated at revision 1
    see(other, Outcome.TRANSIENT, 1.0)
    see(other, Outcome.TRANSIENT, 1.0)  # theirs: suspect at revision 1, stored first
    theirs = other.get(KEY, 1.0).snapshot()
    assert not m.adopt(theirs, 2.0)
    assert m.adopt(theirs, 2.0, force=True)
    assert m.get(KEY, 2.0).state is State.SUSPECT


def test_the_fleet_median_weighs_each_gateways_median_by_its_samples() -> None:
    track = LatencyTrack(factor=3.0, window_s=600.0, min_samples=20)
    for ms in (100.0, 110.0, 120.0):
        track.observe(1.0, ms)
    assert track.median() is None  # 3 samples of our own: too few
    track.others = [(10, 400.0), (30, 200.0)]
    assert track.median() == 200.0  # 43 samples; the heaviest median in the middle
    track.others = [(100, 1000.0)]
    assert track.median() == 1000.0
    track.others = [(5, 50.0)]
    assert track.median() is None  # 8 samples in the whole fleet
