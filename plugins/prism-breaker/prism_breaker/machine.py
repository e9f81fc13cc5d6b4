"""The per-binding recovery state machine: pure, in memory, driven by an explicit ``now``.

eligible -> suspect -> isolated -> trial -> eligible, with hysteresis: a
trip needs one policy's evidence; restoring needs ``trial_min_successes``
trial successes over at least ``trial_min_duration_s`` and no trial
failure.  Nothing here reads a clock or does I/O: the plugin passes the
gateway's clock value in, which is what lets tests drive time exactly.
Every transition is appended to :attr:`Machine.outbox` for the store.

With a fleet (several gateways sharing one store) the machine also keeps
what it must report (window entries, trial successes), takes in what the
others saw (:meth:`Machine.judge`), and adopts the states they recorded
(:meth:`Machine.adopt`).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from prism_proxy import Outcome

from .health import (
    ADMITTED,
    Admission,
    BindingHealth,
    Observation,
    Snapshot,
    State,
    Transition,
)
from .predictor import Predictions
from .settings import Settings
from .trackers import ErrorWindow, LatencyTrack, Slowness

__all__ = ["COUNTED_FAILURES", "Machine"]


#: Failures that count against a binding.  ``broken_stream`` is a stream that
#: broke before its first content: the binding failed to start an answer,
#: exactly like a 5xx.  Rate limits (the route is alive), request errors (the
#: caller's fault), empty completions and cancellations never count.
COUNTED_FAILURES = frozenset(
    {Outcome.TRANSIENT, Outcome.TIMEOUT, Outcome.PERMANENT, Outcome.BROKEN_STREAM}
)
STREAM, BODY = "stream", "body"
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_ELIGIBLE, _ISOLATED, _TRIAL = State.ELIGIBLE, State.ISOLATED, State.TRIAL
_OK = Outcome.OK
_SLOW = Slowness.SLOW


class Machine:
    """Every binding's state, the policies that move it, and the trial slot."""

    def __init__(self, settings: Settings, *, fleet: bool = False) -> None:
        self.settings = settings
        #: Evidence is shared with other gateways: keep what they have not been told.
        self.fleet = fleet
        self.bindings: dict[str, BindingHealth] = {}
        self.outbox: list[Transition] = []
        self._tokens = itertools.count(1)
        #: The opt-in predictor's per-binding history (``[prism:breaker] predictor``).
        self.predictions = Predictions()

    # -- reading -------------------------------------------------------------

    def get(self, key: str, now: float) -> BindingHealth:
        found = self.bindings.get(key)
        if found is None:
            s = self.settings
            found = BindingHealth(
                binding=key,
                since=now,
                errors=ErrorWindow(s.error_rate_window_s, unsent=[] if self.fleet else None),
                latency={
                    kind: LatencyTrack(
                        s.latency_factor,
                        s.latency_window_s,
                        s.latency_min_samples,
                        floor_ms=s.latency_floor_ms,
                    )
                    for kind in (STREAM, BODY)
                },
            )
            self.bindings[key] = found
        return found

    def tick(self, key: str, now: float) -> BindingHealth:
        """The binding, after moving it to trial if its isolation window has ended."""
        b = self.bindings.get(key) or self.get(key, now)
        if b.state is _ISOLATED and (b.isolated_until is None or now >= b.isolated_until):
            self._to_trial(b, "isolation window ended", now)
        return b

    def _to_trial(self, b: BindingHealth, cause: str, now: float) -> Transition:
        transition = self._move(b, State.TRIAL, cause, now, self.evidence(b, now))
        b.trial_revision = b.revision
        b.trial_since = now
        b.trial_successes = 0
        b.trial_unsent = 0
        b.leases.clear()
        b.next_slot_at = now
        return transition

    # -- probes --------------------------------------------------------------

    def probe_passed(self, key: str, detail: str, now: float) -> Transition | None:
        """A probe of an isolated binding passed: its trial opens now, not when the
        window ends.  Eligibility still needs the trial's own evidence."""
        b = self.tick(key, now)
        if b.state is not State.ISOLATED:
            return None
        return self._to_trial(b, f"probe passed ({detail}): trial opened early", now)

    def probe_failed(self, key: str, detail: str, now: float) -> Transition | None:
        """A probe of an isolated or trial binding failed: isolated again, one backoff step
        further, as a failed trial would be."""
        b = self.tick(key, now)
        if b.state not in (State.ISOLATED, State.TRIAL):
            return None
        return self._isolate(b, f"probe failed: {detail}", now, None, escalate=True)

    def assessment(self, b: BindingHealth, now: float) -> str:
        """healthy, uncertain (too little evidence), suspect, or unavailable."""
        if b.state is State.ISOLATED:
            return "unavailable"
        if b.state is State.SUSPECT:
            return "suspect"
        if b.state is State.TRIAL:
            return "uncertain"  # still collecting the evidence restoration needs
        b.errors.prune(now)
        if b.errors.calls < self.settings.error_rate_min_calls:
            return "uncertain"
        return "healthy"

    def evidence(
        self, b: BindingHealth, now: float, obs: Observation | None = None
    ) -> dict[str, Any]:
        b.errors.prune(now)
        evidence: dict[str, Any] = {
            "consecutive_failures": b.consecutive,
            "window_s": self.settings.error_rate_window_s,
            "window_calls": b.errors.calls,
            "window_failures": b.errors.failures,
            "error_rate": round(b.errors.rate, 4),
        }
        for kind, track in b.latency.items():
            median = track.median()
            if median is not None or track.slow_since is not None:
                evidence[f"{kind}_median_ms"] = None if median is None else round(median, 1)
                evidence[f"{kind}_slow_for_s"] = round(track.slow_for(now), 1)
                evidence[f"{kind}_slow_samples"] = track.slow_count
        if b.state is State.TRIAL:
            evidence["trial_successes"] = b.trial_successes
            evidence["trial_for_s"] = round(now - (b.trial_since or now), 1)
        if obs is not None:
            # Which attempt decided, and the revision it started under.
            evidence["attempt"] = {
                "id": obs.attempt_id,
                "revision": obs.revision,
                "outcome": str(obs.outcome),
                "status": obs.status,
                "first_byte_ms": None if obs.first_byte_ms is None else round(obs.first_byte_ms),
            }
        return evidence

    # -- routing -------------------------------------------------------------

    def admit(self, key: str, now: float) -> Admission:
        """May an ordinary call use this binding now?  Hands out the trial slot.

        The slot goes to one caller at a time (``trial_max_in_flight``), and
        the next one opens no sooner than ``trial_spacing_s`` later: the
        window moves the moment the slot is handed out, so a burst of
        concurrent callers cannot all land on a binding that is still dead.
        """
        b = self.tick(key, now)
        if b.state is State.ELIGIBLE:
            return ADMITTED
        if b.state is State.SUSPECT:
            # Evidence is gathering: enough calls to settle it, not a whole burst.
            if b.in_flight >= self.settings.suspect_max_inflight:
                return Admission(False, f"breaker: suspect, {b.in_flight} in flight")
            return ADMITTED
        if b.state is State.ISOLATED:
            return Admission(False, "breaker: isolated")
        for token, until in list(b.leases.items()):
            if until <= now:
                del b.leases[token]
        if len(b.leases) >= self.settings.trial_max_in_flight or now < b.next_slot_at:
            return Admission(False, "breaker: trial in progress")
        token = next(self._tokens)
        b.leases[token] = now + self.settings.trial_lease_s
        b.next_slot_at = now + self.settings.trial_spacing_s
        return Admission(True, trial_token=token)

    def release(self, key: str, token: int) -> None:
        b = self.bindings.get(key)
        if b is not None:
            b.leases.pop(token, None)

    # -- evidence ------------------------------------------------------------

    def observe(self, key: str, obs: Observation, now: float) -> Transition | None:
        """Apply one classified attempt; returns the transition it caused, if any."""
        b = self.bindings.get(key)
        if b is None or b.state is _ISOLATED:
            b = self.tick(key, now)
        outcome = obs.outcome
        b.counts[str(outcome)] += 1
        failed = outcome in COUNTED_FAILURES
        if not failed and outcome is not _OK:
            return None  # rate limits, request errors, empties, cancellations never count
        if obs.revision < b.isolated_revision:
            b.stale += 1  # started before the latest isolation: not evidence of anything now
            return None
        state = b.state
        if state is _ISOLATED:
            return None  # stand-down traffic: the window, not this answer, decides
        if state is _TRIAL:
            return self._observe_trial(b, obs, failed, now)
        return self._observe_open(b, obs, failed, now)

    def _observe_open(
        self, b: BindingHealth, obs: Observation, failed: bool, now: float
    ) -> Transition | None:
        s = self.settings
        b.errors.add(now, failed)
        if failed:
            b.consecutive += 1
            if obs.outcome is Outcome.PERMANENT:
                return self._isolate(b, f"permanent failure: {_why(obs)}", now, obs)
            if "consecutive" in s.policies and b.consecutive >= s.consecutive_failures:
                return self._isolate(
                    b, f"{b.consecutive} consecutive failures ({_why(obs)})", now, obs
                )
            tripped = self._error_rate_trip(b, now, obs)
            if tripped is not None:
                return tripped
        else:
            b.consecutive = 0
            kind = STREAM if obs.streaming else BODY
            track = b.latency[kind]
            if (
                obs.first_byte_ms is not None
                and track.observe(now, obs.first_byte_ms) is _SLOW
                and "latency" in s.policies
                and self._judged(kind)
                and track.slow_count >= s.latency_min_slow
                and track.slow_for(now) >= s.latency_sustain_s
            ):
                median = track.median() or 0.0
                return self._isolate(
                    b,
                    f"{kind} first-byte latency over {s.latency_factor:g}x its median "
                    f"({median:.0f} ms) for {track.slow_for(now):.0f} s",
                    now,
                    obs,
                )
        return self._suspicion(b, now)

    def _error_rate_trip(
        self, b: BindingHealth, now: float, obs: Observation | None
    ) -> Transition | None:
        s = self.settings
        if (
            "error_rate" in s.policies
            and b.errors.calls >= s.error_rate_min_calls
            and b.errors.rate > s.error_rate
        ):
            return self._isolate(
                b,
                f"error rate {b.errors.rate:.0%} over {s.error_rate_window_s:g} s "
                f"({b.errors.failures}/{b.errors.calls})",
                now,
                obs,
            )
        return None

    def judge(self, key: str, now: float) -> Transition | None:
        """Apply the policies to evidence that came without an observation of ours:
        the other gateways' window counts and trial successes."""
        b = self.tick(key, now)
        if b.state is State.TRIAL:
            return self._trial_passed(b, now, None)
        if b.state is State.ISOLATED:
            return None
        b.errors.prune(now)
        tripped = self._error_rate_trip(b, now, None)
        # Only our own observations clear a suspicion: others' counts that merely
        # lack our evidence must not undo the suspicion of the gateway that had it.
        return tripped if tripped is not None else self._suspicion(b, now, clear=False)

    def _observe_trial(
        self, b: BindingHealth, obs: Observation, failed: bool, now: float
    ) -> Transition | None:
        s = self.settings
        if obs.revision < b.trial_revision:
            b.stale += 1  # started while isolated (stand-down): not trial evidence
            return None
        if failed:
            return self._isolate(b, f"trial failed: {_why(obs)}", now, obs)
        kind, slowness = self._latency(b, obs, now)
        if slowness is Slowness.SLOW and "latency" in s.policies and self._judged(kind):
            median = b.latency[kind].median() or 0.0
            return self._isolate(
                b, f"trial too slow: {obs.first_byte_ms:.0f} ms vs median {median:.0f} ms", now, obs
            )
        b.trial_successes += 1
        if self.fleet:
            b.trial_unsent += 1
        return self._trial_passed(b, now, obs)

    def _trial_passed(
        self, b: BindingHealth, now: float, obs: Observation | None
    ) -> Transition | None:
        s = self.settings
        trial_for = now - (b.trial_since if b.trial_since is not None else now)
        if b.trial_successes >= s.trial_min_successes and trial_for >= s.trial_min_duration_s:
            cause = f"trial passed: {b.trial_successes} successes over {trial_for:.0f} s"
            transition = self._move(b, State.ELIGIBLE, cause, now, self.evidence(b, now, obs))
            b.restored_at = now
            b.isolated_until = None
            self._clear_evidence(b)
            return transition
        return None

    def _latency(
        self, b: BindingHealth, obs: Observation, now: float
    ) -> tuple[str, Slowness | None]:
        kind = STREAM if obs.streaming else BODY
        if obs.first_byte_ms is None:
            return kind, None
        return kind, b.latency[kind].observe(now, obs.first_byte_ms)

    def _judged(self, kind: str) -> bool:
        return kind == STREAM or self.settings.latency_whole_body

    def _suspicion(self, b: BindingHealth, now: float, *, clear: bool = True) -> Transition | None:
        """eligible <-> suspect: some policy is at least half-way to a trip, or the
        predictor (opt-in) expects the chain to become unavailable soon."""
        model = self.settings.active_predictor
        predicted = None if model is None else self.predictions.reason(model, b, now)
        if predicted is None and b.state is _ELIGIBLE and not b.consecutive:
            errors = b.errors
            if not errors.own_failures and not errors.others[1]:
                for track in b.latency.values():
                    if track.slow_count:
                        break
                else:
                    return None  # a healthy line, as most are: half-way to nothing
        s = self.settings
        reasons = []
        # Each test starts with what is cheapest and, on a healthy line, false.
        if b.consecutive and "consecutive" in s.policies and s.consecutive_failures > 1:
            if b.consecutive >= math.ceil(s.consecutive_failures / 2):
                reasons.append(f"{b.consecutive} consecutive failures")
        errors = b.errors
        if (
            errors.failures
            and "error_rate" in s.policies
            and errors.calls >= math.ceil(s.error_rate_min_calls / 2)
            and errors.rate > s.error_rate
        ):
            reasons.append(f"error rate {errors.rate:.0%} on {errors.calls} calls")
        if "latency" in s.policies:
            # Half-way as for failures: half the slow samples a trip needs, in one run.
            # One slow answer among fast ones is jitter, not a reason to limit a line.
            half = math.ceil(s.latency_min_slow / 2)
            for kind, track in b.latency.items():
                if track.slow_count >= half and self._judged(kind):
                    reasons.append(
                        f"{kind} latency slow for {track.slow_for(now):.0f} s "
                        f"({track.slow_count} slow answers)"
                    )
        if predicted is not None:
            reasons.append(predicted)
        if reasons and b.state is State.ELIGIBLE:
            return self._move(b, State.SUSPECT, "; ".join(reasons), now, self.evidence(b, now))
        if not reasons and b.state is State.SUSPECT and clear:
            return self._move(b, State.ELIGIBLE, "evidence cleared", now, self.evidence(b, now))
        return None

    def _isolate(
        self,
        b: BindingHealth,
        cause: str,
        now: float,
        obs: Observation | None,
        *,
        escalate: bool = False,
    ) -> Transition:
        s = self.settings
        if b.state is State.TRIAL or escalate:
            step = b.step + 1
        elif b.step < 0 or b.restored_at is None or now - b.restored_at >= s.isolation_max_s:
            step = 0  # a first trip, or the first after a long quiet spell
        else:
            step = b.step + 1
        duration = min(s.isolation_s * 2 ** min(step, 30), s.isolation_max_s)
        evidence = self.evidence(b, now, obs)
        evidence["isolation_s"] = duration
        b.step = step
        b.isolated_until = now + duration
        b.next_slot_at = b.isolated_until
        self._clear_evidence(b)
        b.isolated_revision = b.revision + 1  # the revision _move is about to assign
        return self._move(b, State.ISOLATED, cause, now, evidence)

    @staticmethod
    def _clear_evidence(b: BindingHealth) -> None:
        """An isolation or a restoration starts the evidence afresh."""
        b.trial_since = None
        b.trial_successes = 0
        b.trial_unsent = 0
        b.leases.clear()
        b.consecutive = 0
        b.errors.clear()
        for track in b.latency.values():
            track.reset_run()

    def _move(
        self, b: BindingHealth, to: State, cause: str, now: float, evidence: dict[str, Any]
    ) -> Transition:
        from_state = b.state
        b.state = to
        b.cause = cause
        b.since = now
        b.revision += 1
        transition = Transition(
            binding=b.binding,
            from_state=from_state,
            to_state=to,
            cause=cause,
            evidence=evidence,
            revision=b.revision,
            at=now,
            snapshot=b.snapshot(),
        )
        self.outbox.append(transition)
        return transition

    # -- restart -------------------------------------------------------------

    def restore(self, snap: Snapshot, now: float) -> None:
        """Load a persisted binding: isolated stays isolated, trial resumes as trial.

        Trial evidence gathered before the restart is not carried over (it
        lived in memory); the trial starts its observation period again.
        """
        b = self.get(snap.binding, now)
        self._take(b, snap, now)
        if snap.state is State.TRIAL:
            b.trial_revision = snap.revision
            b.trial_since = now
            b.trial_successes = 0
            b.next_slot_at = now

    @staticmethod
    def _take(b: BindingHealth, snap: Snapshot, now: float) -> None:
        """Copy onto ``b`` what ``snap`` records (a trial's own fields are the caller's)."""
        b.state = snap.state
        b.cause = snap.cause
        b.since = snap.since
        b.revision = snap.revision
        b.isolated_revision = snap.isolated_revision
        b.step = snap.step
        b.isolated_until = snap.isolated_until
        b.restored_at = snap.restored_at
        if snap.state is State.ISOLATED:
            b.next_slot_at = snap.isolated_until if snap.isolated_until is not None else now

    def adopt(self, snap: Snapshot, now: float, *, force: bool = False) -> bool:
        """Take a state another gateway recorded; True if it changed ours.

        Only a newer revision is adopted, unless ``force`` (the shared store
        refused our transition: its record is the truth).  A new isolation
        or a restoration clears our evidence as our own would; a trial
        another gateway opened starts our count of its successes at zero
        (the fleet's count comes with the next exchange).
        """
        b = self.get(snap.binding, now)
        if snap.revision <= b.revision and not (force and snap != b.snapshot()):
            return False
        was = b.state
        same_trial = (
            was is State.TRIAL and snap.state is State.TRIAL and b.trial_revision == snap.revision
        )
        new_isolation = snap.isolated_revision != b.isolated_revision
        restored = was in (State.ISOLATED, State.TRIAL) and snap.state in (
            State.ELIGIBLE,
            State.SUSPECT,
        )
        if new_isolation or restored or (snap.state is State.TRIAL and not same_trial):
            self._clear_evidence(b)
        self._take(b, snap, now)
        if snap.state is State.TRIAL and not same_trial:
            b.trial_revision = snap.revision
            b.trial_since = snap.trial_since if snap.trial_since is not None else now
            b.next_slot_at = now
        return True


def _why(obs: Observation) -> str:
    status = f" {obs.status}" if obs.status is not None else ""
    reason = f": {obs.reason}" if obs.reason else ""
    return f"{obs.outcome}{status}{reason}"
