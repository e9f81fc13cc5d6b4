"""What the breaker tells, by itself (``prism_breaker.reports``): the health report, the
evidence an override's audit row keeps, and audit rows as JSON.

No server: a breaker over a small catalog, the clock moved by hand.
"""

from __future__ import annotations

from typing import Any

from prism_breaker.overrides import iso
from prism_breaker.reports import audit_json

from prism_proxy import Outcome, Override

from .conftest import FakeTime, RecordingStore, attempt, isolate, unit_breaker, unit_call


def entry(health: dict[str, Any], binding: str) -> dict[str, Any]:
    for found in health["bindings"]:
        if found["binding"] == binding:
            return found
    raise AssertionError(binding)


def test_an_isolated_line_shows_its_cause_and_window_end_in_wall_time(
    fake_time: FakeTime,
) -> None:
    breaker = unit_breaker(fake_time, "a", "b")
    isolated_at = fake_time.now
    isolate(breaker, "a/up-a")
    fake_time.advance(5.0)
    health = breaker.health(with_text=False)
    a = entry(health, "a/up-a")
    assert (a["state"], a["assessment"]) == ("isolated", "unavailable")
    assert a["cause"] == "permanent failure: permanent 401: upstream 401"
    assert a["since"] == iso(breaker.wall.at(isolated_at))
    assert a["isolated_until"] == iso(breaker.wall.at(isolated_at + 30.0))
    assert a["counts"] == {"permanent": 1, "stale_ignored": 0}
    assert a["used_by"] == ["m"]
    b = entry(health, "b/up-b")
    assert (b["state"], b["assessment"], b["isolated_until"]) == ("eligible", "uncertain", None)
    assert health["store"] == {
        "where": "memory (nothing survives a restart)",
        "pending_writes": 1,
        "dropped_writes": 0,
        "last_error": None,
        "shared": None,
    }


def test_a_trial_and_a_ramp_report_their_progress(fake_time: FakeTime) -> None:
    breaker = unit_breaker(
        fake_time, "a", trial_min_successes=2, trial_min_duration_s=10.0, ramp_s=30.0
    )
    isolate(breaker, "a/up-a")
    fake_time.advance(30.0)
    attempt(breaker, unit_call(), "a/up-a", Outcome.OK, 200)
    fake_time.advance(4.0)
    trial = entry(breaker.health(with_text=False), "a/up-a")["trial"]
    assert trial == {
        "successes": 1,
        "needed": 2,
        "observed_s": 4.0,
        "needed_s": 10.0,
        "slots_in_use": 0,
        "max_in_flight": 1,
    }
    fake_time.advance(6.0)
    attempt(breaker, unit_call(), "a/up-a", Outcome.OK, 200)  # restored
    fake_time.advance(15.0)
    a = entry(breaker.health(with_text=False), "a/up-a")
    assert a["state"] == "eligible" and "trial" not in a
    assert a["ramp"] == {"share": 0.5, "left_s": 15.0}


def test_the_operators_words_on_an_override_need_the_text(fake_time: FakeTime) -> None:
    breaker = unit_breaker(fake_time, "a")
    now = breaker.wall.now()
    breaker.overrides.add(
        Override(
            id="ovr_q",
            kind="quarantine",
            scope="model",
            target="up-a",
            reason="customer escalation 1234",
            owner="dana",
            created_at=now,
            review_by=now + 3600,
        )
    )
    public = breaker.health(with_text=False)
    admin = breaker.health(with_text=True)
    assert entry(public, "a/up-a")["assessment"] == "unavailable"
    for health in (public, admin):
        assert [o["id"] for o in health["overrides"]] == ["ovr_q"]
        assert health["reviews_due_soon"] == ["ovr_q"]  # within review_warn_h (24 h)
    assert "reason" not in public["overrides"][0]
    assert admin["overrides"][0]["reason"] == "customer escalation 1234"
    assert admin["overrides"][0]["owner"] == "dana"


async def test_an_override_audit_row_keeps_the_state_of_what_it_covers(
    fake_time: FakeTime,
) -> None:
    store = RecordingStore()
    breaker = unit_breaker(fake_time, "a", "b", store=store)
    isolate(breaker, "a/up-a")
    now = breaker.wall.now()
    await breaker.add_override(
        Override(
            id="ovr_q",
            kind="quarantine",
            scope="provider",
            target="a",
            reason="looking",
            owner="dana",
            created_at=now,
            review_by=now + 3600,
        )
    )
    [row] = store.audit_rows
    shown = audit_json(row)
    assert shown["subject"] == "provider:a" and shown["override"] == "ovr_q"
    assert shown["at"] == iso(now)
    covered = shown["evidence"]["bindings"]
    assert list(covered) == ["a/up-a"]  # b is another provider's
    assert covered["a/up-a"]["state"] == "isolated"
    assert covered["a/up-a"]["cause"] == "permanent failure: permanent 401: upstream 401"
