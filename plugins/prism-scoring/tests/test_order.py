"""Scores and the power-of-two-choices order, without a gateway: injected clock and random."""

from __future__ import annotations

import random

import pytest
from prism_scoring import GroupOrder, Line, Settings, Stat, draw_order, scores_of

from prism_proxy import Binding, Route


def scripted(*values: float):
    """A ``random()`` that returns ``values`` in order."""
    it = iter(values)
    return lambda: next(it)


def stat(*, latency_ms: float | None = None, errors: int = 0, answers: int = 1) -> Stat:
    s = Stat()
    for _ in range(answers):
        s.observe(0.0, 60.0, latency_ms=latency_ms, error=False)
    for _ in range(errors):
        s.observe(0.0, 60.0, latency_ms=None, error=True)
    return s


def test_samples_decay_by_half_every_half_life():
    s = Stat()
    s.observe(100.0, 60.0, latency_ms=100.0, error=True)
    s.observe(160.0, 60.0, latency_ms=400.0, error=False)
    # The first sample weighs 1/2 after one half-life: (50 + 400) / 1.5.
    assert s.latency_ms == pytest.approx(300.0)
    assert s.error_rate == pytest.approx(0.5 / 1.5)
    s.observe(160.0 + 600.0, 60.0, latency_ms=10.0, error=False)  # ten half-lives later
    assert s.latency_ms == pytest.approx(10.0, abs=0.5)


def test_the_clock_going_nowhere_does_not_decay():
    s = Stat()
    for latency in (10.0, 20.0, 30.0):
        s.observe(5.0, 60.0, latency_ms=latency, error=False)
    assert s.latency_ms == pytest.approx(20.0)
    assert s.error_rate == 0.0


def test_errors_are_worth_the_penalty():
    fast_failing = stat(latency_ms=100.0, answers=1, errors=1)  # error rate 1/2
    slow_healthy = stat(latency_ms=900.0)
    assert scores_of([fast_failing, slow_healthy], 2000.0) == [1100.0, 900.0]
    assert scores_of([fast_failing, slow_healthy], 0.0) == [100.0, 900.0]


def test_a_line_without_samples_is_neutral():
    assert scores_of([stat(latency_ms=100.0), stat(latency_ms=300.0), None], 2000.0) == [
        100.0,
        300.0,
        200.0,
    ]
    # Failed every time so far: no latency of its own, the others' mean stands in.
    dead = stat(answers=0, errors=2)
    assert scores_of([stat(latency_ms=100.0), dead], 1000.0) == [100.0, 1100.0]
    assert scores_of([None, None], 2000.0) == [0.0, 0.0]


def test_the_better_of_two_draws_takes_the_position():
    # Draws: index 0 then index 1 -> 1 is better and leads; the last one follows.
    assert draw_order([5.0, 1.0], [1.0, 1.0], scripted(0.1, 0.9)) == [1, 0]
    # Index 0 drawn twice: it leads, whatever its score.
    assert draw_order([5.0, 1.0], [1.0, 1.0], scripted(0.1, 0.2)) == [0, 1]
    # A tie goes to the first drawn.
    assert draw_order([1.0, 1.0], [1.0, 1.0], scripted(0.9, 0.1)) == [1, 0]
    # Three lines: position 1 from {0, 1, 2}, position 2 from the two left.
    assert draw_order([3.0, 1.0, 2.0], [1.0] * 3, scripted(0.0, 0.99, 0.0, 0.99)) == [2, 1, 0]


def test_every_line_leads_with_at_least_its_weight_share_squared():
    rng = random.Random(1)
    n = 20_000

    def leads(scores, weights):
        counts = [0] * len(scores)
        for _ in range(n):
            counts[draw_order(scores, weights, rng.random)[0]] += 1
        return [c / n for c in counts]

    assert leads([1.0, 2.0], [1.0, 1.0]) == pytest.approx([0.75, 0.25], abs=0.02)
    assert leads([1.0, 2.0, 3.0], [1.0] * 3) == pytest.approx([5 / 9, 3 / 9, 1 / 9], abs=0.02)
    assert leads([1.0, 2.0], [3.0, 1.0]) == pytest.approx([15 / 16, 1 / 16], abs=0.02)
    # Equal scores: the weights alone decide.
    assert leads([1.0, 1.0], [1.0, 3.0]) == pytest.approx([0.25, 0.75], abs=0.02)


def lines(*specs: tuple[str, str | None, float]) -> tuple[list[Binding], dict[Binding, Line]]:
    bindings = [Binding(provider=p, model="m") for p, _, _ in specs]
    grouped = {
        b: Line(group, weight)
        for b, (_, group, weight) in zip(bindings, specs, strict=True)
        if group is not None
    }
    return bindings, grouped


def order_for(grouped: dict[Binding, Line], rng, stats=None) -> GroupOrder:
    return GroupOrder(grouped, stats or {}, Settings(), clock=lambda: 0.0, random=rng)


def test_a_route_without_a_group_is_left_alone():
    bindings, grouped = lines(("a", None, 1), ("b", "g", 1), ("c", "g", 1))
    order = order_for(grouped, random.Random(0).random)
    other = (bindings[0], Binding(provider="x", model="m"))  # no grouped line
    route = Route(bindings=other)
    order.order(route)
    assert route.bindings is other  # not even a new tuple
    assert route.notes == []


def test_only_runs_of_one_group_are_reordered():
    bindings, grouped = lines(
        ("a", None, 1), ("b", "g", 1), ("c", "g", 1), ("d", "h", 1), ("e", "h", 1), ("f", None, 1)
    )
    a, b, c, d, e, f = bindings
    stats = {"c/m": stat(latency_ms=10.0), "b/m": stat(latency_ms=900.0)}
    # Draws: g -> (b, c): c leads; h -> (e, e): e leads.
    order = order_for(grouped, scripted(0.1, 0.9, 0.9, 0.9), stats)
    skipped = [(Binding(provider="z", model="m"), "breaker: isolated")]
    route = Route(bindings=tuple(bindings), skipped=list(skipped))
    order.order(route)
    assert route.bindings == (a, c, b, e, d, f)
    assert route.notes == ["scoring: group g order c/m, b/m", "scoring: group h order e/m, d/m"]
    assert route.skipped == skipped


def test_a_split_group_is_ordered_run_by_run():
    # A rule's chain may interrupt a group: never reorder across the interruption.
    bindings, grouped = lines(("b", "g", 1), ("x", None, 1), ("c", "g", 1), ("d", "g", 1))
    b, x, c, d = bindings
    order = order_for(grouped, scripted(0.9, 0.9))  # d drawn twice: d leads its run
    route = Route(bindings=(b, x, c, d))
    order.order(route)
    assert route.bindings == (b, x, d, c)
    assert route.notes == ["scoring: group g order d/m, c/m"]  # a run of one has no order
