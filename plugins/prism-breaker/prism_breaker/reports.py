"""What the breaker tells: ``/prism/health``, the evidence an audit row keeps, audit rows as JSON.

Read-only views of a :class:`~prism_breaker.runtime.Breaker`; nothing here
moves a state (reading a binding does record an isolation window that has
ended, as any look at it would).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prism_proxy import AuditEntry, Binding, Override

from .health import State
from .overrides import iso, override_json

if TYPE_CHECKING:
    from .runtime import Breaker

__all__ = ["audit_json", "health_report", "scope_evidence"]


def health_report(
    breaker: Breaker,
    *,
    with_text: bool,
    capacity: Callable[[Binding], dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """Every binding's state; ``capacity`` adds a limited line's slots and queue."""
    machine, settings, wall = breaker.machine, breaker.settings, breaker.wall
    now = breaker.clock()
    wall_now = wall.at(now)
    bindings = []
    for binding in breaker.catalog.bindings.values():
        h = machine.tick(binding.id, now)
        overrides = breaker.overrides.for_binding(binding, wall_now)
        assessment = machine.assessment(h, now)
        if any(o.kind == "quarantine" for o in overrides):
            assessment = "unavailable"
        h.errors.prune(now)
        entry: dict[str, Any] = {
            "binding": binding.id,
            "provider": binding.provider,
            "model": binding.model,
            "used_by": breaker.used_by.get(binding.id, []),
            "state": str(h.state),
            "assessment": assessment,
            "cause": h.cause,
            "since": iso(wall.at(h.since)),
            "revision": h.revision,
            "isolated_until": (
                iso(wall.at(h.isolated_until))
                if h.state is State.ISOLATED and h.isolated_until is not None
                else None
            ),
            "in_flight": h.in_flight,
            "capacity": capacity(binding) if capacity is not None else None,
            "consecutive_failures": h.consecutive,
            "counts": {**dict(sorted(h.counts.items())), "stale_ignored": h.stale},
            "window": {
                "seconds": settings.error_rate_window_s,
                "calls": h.errors.calls,
                "failures": h.errors.failures,
                "error_rate": round(h.errors.rate, 4),
            },
            "first_byte_ms": {kind: track.percentiles(now) for kind, track in h.latency.items()},
            "overrides": [override_json(o, wall_now, with_text=with_text) for o in overrides],
        }
        share = breaker.admission.ramp_share(h, now)
        if share < 1.0 and h.restored_at is not None:
            entry["ramp"] = {
                "share": round(share, 3),
                "left_s": round(settings.ramp_s - (now - h.restored_at), 1),
            }
        if h.last_probe is not None:
            entry["probe"] = h.last_probe
        if h.state is State.TRIAL:
            entry["trial"] = {
                "successes": h.trial_successes,
                "needed": settings.trial_min_successes,
                "observed_s": round(now - (h.trial_since or now), 1),
                "needed_s": settings.trial_min_duration_s,
                "slots_in_use": len(h.leases),
                "max_in_flight": settings.trial_max_in_flight,
            }
        bindings.append(entry)
    sync = breaker.sync
    if machine.outbox:
        sync.wake.set()  # windows that ended while we looked: the store should know
    active = sorted(breaker.overrides.active.values(), key=lambda o: o.created_at)
    return {
        "bindings": bindings,
        "overrides": [override_json(o, wall_now, with_text=with_text) for o in active],
        "overdue_reviews": [o.id for o in active if o.review_overdue(wall_now)],
        "reviews_due_soon": [
            o.id for o in breaker.overrides.review_soon(wall_now, settings.review_warn_h * 3600)
        ],
        "stand_downs": breaker.counters["breaker_stand_down"],
        "probes": breaker.probe_status,
        "store": {
            "where": breaker.store.description,
            "pending_writes": sync.pending_writes,
            "dropped_writes": sync.dropped_transitions,
            "last_error": sync.last_store_error,
            "shared": None if breaker.fleet is None else breaker.fleet.healthy,
        },
    }


def scope_evidence(breaker: Breaker, override: Override) -> dict[str, Any]:
    """The state of every binding ``override`` covers, at this moment (for its audit row)."""
    machine = breaker.machine
    now = breaker.clock()
    out: dict[str, Any] = {}
    for binding in breaker.catalog.bindings.values():
        if override.covers(binding):
            h = machine.tick(binding.id, now)
            out[binding.id] = {
                "state": str(h.state),
                "cause": h.cause,
                "in_flight": h.in_flight,
                **machine.evidence(h, now),
            }
    return {"bindings": out}


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": iso(entry.at),
        "actor": entry.actor,
        "action": entry.action,
        "subject": entry.subject,
        "from": entry.from_state,
        "to": entry.to_state,
        "cause": entry.cause,
        "revision": entry.revision,
        "override": entry.override_id,
        "evidence": entry.evidence,
    }
