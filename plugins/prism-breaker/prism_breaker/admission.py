"""Which bindings a call may try, and what its attempts tell: the breaker's per-call hooks.

:class:`CallAdmission` filters each route (skipping what is out, reserving
trial slots, standing down when everything is out), vetoes an attempt whose
binding has gone out since, tags each attempt with the binding's revision
and feeds its classified outcome to the machine.  Everything here runs on
the hot path and touches memory only; the transitions it causes queue in
the machine's outbox, and :attr:`CallAdmission.wake` tells the store sync
to write them.  The one wait is a trial attempt with a fleet, which leases
its slot from the shared store first.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable

import attrs

from prism_proxy import SERVING_OUTCOMES, Attempt, Binding, Call, Fleet, Route, Settlement, Verdict

from .health import BindingHealth, Observation, State, Transition
from .machine import Machine
from .overrides import OverrideBook
from .records import WallClock
from .settings import Settings

__all__ = ["CUSTOMER", "HEADER", "AttemptTag", "CallAdmission", "CallState"]

HEADER = "x-prism-breaker"
#: A ramping binding's share of calls starts here (Envoy's slow start has a floor too).
RAMP_FLOOR = 0.1
CUSTOMER = "customer"
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_ELIGIBLE = State.ELIGIBLE


@attrs.define(eq=False)
class AttemptTag:
    """``attempt.extensions["breaker"]``: who this attempt was, in the breaker's time."""

    revision: int
    state: str
    trial_token: int | None
    in_flight: bool = True


@attrs.define(eq=False)
class CallState:
    """``call.extensions["breaker"]``, once a call holds a trial slot or stands down."""

    trials: dict[str, int] = attrs.field(factory=dict)
    marks: list[str] = attrs.field(factory=list)
    #: Bindings a stand-down chose to try although they were out: each gets one try.
    stand_down: set[str] = attrs.field(factory=set)


class CallAdmission:
    """The per-call half of the breaker: admission, attempt tags and evidence."""

    @property
    def settings(self) -> Settings:
        """The machine's: one copy, which a reload replaces (``Breaker.adopt``)."""
        return self.machine.settings

    def __init__(
        self,
        machine: Machine,
        overrides: OverrideBook,
        wall: WallClock,
        clock: Callable[[], float],
        counters: collections.Counter[str],
        fleet: Fleet | None,
        wake: asyncio.Event,
        after: Callable[[Transition | None], None],
        random: Callable[[], float],
    ) -> None:
        self.machine = machine
        self.overrides = overrides
        self.wall = wall
        self.clock = clock
        self.counters = counters
        self.fleet = fleet
        #: Set when the machine's outbox has something for the store.
        self.wake = wake
        #: What a transition entails beyond the machine (a manual restore's hold).
        self.after = after
        #: Decides which calls a ramping binding takes (tests inject their own).
        self.random = random

    def select(self, call: Call, route: Route) -> None:
        """Filter ``route`` in place: skip what is out, stand down when everything is."""
        if call.traffic != CUSTOMER:
            return  # probes and preflight test a line whatever its state
        if self._all_simply_in(route.bindings):
            return  # the common case: nothing to skip, reserve or hold
        now = self.clock()
        decided: list[tuple[Binding, str | None, bool]] = []
        admitted = 0
        for binding in route.bindings:
            reason, hard, token = self._admit(binding, now)
            if token is not None:
                self._call_state(call).trials[binding.id] = token
            decided.append((binding, reason, hard))
            admitted += reason is None
        if admitted == len(decided):
            pass  # the common case: every line is in, the route stays as it is
        elif admitted:
            route.bindings = tuple(b for b, reason, _ in decided if reason is None)
            route.skipped.extend((b, reason) for b, reason, _ in decided if reason is not None)
        elif any(not hard for _, _, hard in decided):
            # Skipping every binding would turn an outage into a synthetic error with
            # no upstream answer in it: try the chain in order instead.  Operator
            # overrides still hold: a quarantine is not lifted by the breaker giving up.
            route.bindings = tuple(b for b, _, hard in decided if not hard)
            route.skipped.extend((b, reason) for b, reason, hard in decided if hard and reason)
            route.notes.append("breaker: every binding is out; standing down, trying them all")
            state = self._call_state(call)
            state.stand_down.update(b.id for b in route.bindings)
            if "stand-down" not in state.marks:
                state.marks.append("stand-down")
            self.counters["breaker_stand_down"] += 1
            call.response_headers[HEADER] = ", ".join(state.marks)
        else:
            route.bindings = ()
            route.skipped.extend((b, reason) for b, reason, _ in decided if reason is not None)
        if self.machine.outbox:
            self.wake.set()

    def _all_simply_in(self, bindings: Iterable[Binding]) -> bool:
        """Whether every one of ``bindings`` is eligible, past any ramp, under no override:
        what :meth:`_admit` would find, found without it."""
        if self.overrides.active:
            return False
        health = self.machine.bindings
        ramp_s = self.settings.ramp_s
        now: float | None = None
        for binding in bindings:
            h = health.get(binding.id)
            if h is None or h.state is not _ELIGIBLE:
                return False
            if h.restored_at is not None and ramp_s > 0:
                if now is None:
                    now = self.clock()
                if now - h.restored_at < ramp_s:
                    return False
        return True

    def _admit(self, binding: Binding, now: float) -> tuple[str | None, bool, int | None]:
        """(why it is skipped or None, whether an operator override decided, trial token)."""
        held = self._held_by_operator(binding, now)
        if held is not None:
            return held, True, None
        admission = self.machine.admit(binding.id, now)
        if not admission.admitted:
            return admission.reason, False, None
        if admission.trial_token is None:
            share = self.ramp_share(self.machine.get(binding.id, now), now)
            if share < 1.0 and self.random() >= share:
                return f"breaker: ramping up ({share:.0%} of calls)", False, None
        return None, False, admission.trial_token

    def ramp_share(self, h: BindingHealth, now: float) -> float:
        """The share of calls a binding restored ``ramp_s`` ago or less takes (slow start)."""
        ramp_s = self.settings.ramp_s
        if ramp_s <= 0 or h.restored_at is None or h.state not in (State.ELIGIBLE, State.SUSPECT):
            return 1.0
        elapsed = now - h.restored_at
        return 1.0 if elapsed >= ramp_s else max(RAMP_FLOOR, elapsed / ramp_s)

    def _held_by_operator(self, binding: Binding, now: float) -> str | None:
        """Why a quarantine or a full cap keeps ``binding`` out right now, or None."""
        if not self.overrides.active:
            return None  # the usual case: no operator has set any
        overrides = self.overrides.for_binding(binding, self.wall.at(now))
        for o in overrides:
            if o.kind == "quarantine":
                return f"breaker: quarantined ({o.id})"
        for o in overrides:
            cap = o.max_in_flight or 0
            if self.machine.get(binding.id, now).in_flight >= cap:
                return f"breaker: cap {cap} reached ({o.id})"
        return None

    def admit_attempt(self, call: Call, binding: Binding) -> str | Awaitable[str | None] | None:
        """May this call try ``binding`` now (a first try or a retry)?  None, or why not.

        The route was chosen before the call's earlier attempts ran; this sees
        what happened since.  The dispatch loop starts the attempt right after
        asking, without yielding to other calls, so a cap checked here is exact.
        A trial attempt with a fleet answers with an awaitable: the slot is the
        fleet's to give (:meth:`_fleet_trial`).
        """
        if call.traffic != CUSTOMER:
            return None
        if not self.overrides.active and self._state_of(call) is None:
            h = self.machine.bindings.get(binding.id)
            if h is not None and h.state is _ELIGIBLE:
                return None  # the common case: no trial, stand-down or override to weigh
        now = self.clock()
        held = self._held_by_operator(binding, now)
        if held is not None:
            return held  # overrides win, in a stand-down too
        key = binding.id
        state = self._state_of(call)
        if state is not None:
            # Dispatch retries a binding straight after its failed attempt, with no other
            # attempt in between: the call's last attempt being on it is what a retry is.
            retry = bool(call.attempts) and call.attempts[-1].binding.id == key
            if not retry:
                if key in state.trials and self.machine.tick(key, now).state is State.TRIAL:
                    # The trial slot reserved when the route was chosen.
                    return self._fleet_trial(call, binding, state.trials[key])
                if key in state.stand_down:
                    return None  # a stand-down tries each binding once, whatever its state
            stale = state.trials.pop(key, None)
            if stale is not None:  # the trial it was reserved for has ended
                self._release_trial(key, stale)
        # The routing rule again, now: an isolated binding (the failure just before
        # this retry may have isolated it, or a trial just failed) is not tried, and
        # an attempt on a binding in trial needs a trial slot of its own.
        admission = self.machine.admit(key, now)
        if admission.trial_token is not None:
            self._call_state(call).trials[key] = admission.trial_token
        if self.machine.outbox:
            self.wake.set()
        if not admission.admitted:
            return admission.reason
        if admission.trial_token is not None:
            return self._fleet_trial(call, binding, admission.trial_token)
        return None

    def _fleet_trial(
        self, call: Call, binding: Binding, token: int
    ) -> Awaitable[str | None] | None:
        """With a fleet that answers, the trial slot must also be the fleet's."""
        fleet = self.fleet
        if fleet is None or not fleet.healthy:
            return None  # one gateway, or the fleet unreachable: our own slot decides
        return self._take_fleet_trial(fleet, call, binding, token)

    async def _take_fleet_trial(
        self, fleet: Fleet, call: Call, binding: Binding, token: int
    ) -> str | None:
        s = self.settings
        key = binding.id
        try:
            taken = await fleet.take_trial(
                key,
                token,
                max_in_flight=s.trial_max_in_flight,
                lease_s=s.trial_lease_s,
                spacing_s=s.trial_spacing_s,
            )
        except Exception:
            taken = True  # the fleet went away while we asked: our own slot decides
            self.counters["breaker_fleet_trial_local"] += 1
        state = self._call_state(call)
        if not taken:
            state.trials.pop(key, None)
            self.machine.release(key, token)
            return "breaker: trial in progress on another gateway"
        # Concurrent calls ran while we waited: the binding may have left its trial
        # (another gateway's trial failed) or an operator's cap may have filled.
        now = self.clock()
        held = self._held_by_operator(binding, now)
        health = self.machine.tick(key, now)
        if held is not None or health.state is not State.TRIAL:
            state.trials.pop(key, None)
            self._release_trial(key, token)
            return held or f"breaker: {health.state}"
        return None

    def _release_trial(self, key: str, token: int) -> None:
        self.machine.release(key, token)
        if self.fleet is not None:
            self.fleet.end_trial(key, token)

    def attempt_start(self, call: Call, attempt: Attempt) -> None:
        key = attempt.binding.id
        health = self.machine.tick(key, self.clock())
        state = self._state_of(call)
        token = None if state is None else state.trials.pop(key, None)
        attempt.extensions["breaker"] = AttemptTag(health.revision, health.state, token)
        health.in_flight += 1
        if state is not None and token is not None:
            mark = f"trial {key}"
            if mark not in state.marks:
                state.marks.append(mark)
            call.response_headers[HEADER] = ", ".join(state.marks)
        if self.machine.outbox:
            self.wake.set()

    def on_attempt(self, call: Call, attempt: Attempt, *, evidence: bool = True) -> None:
        tag = attempt.extensions.get("breaker")
        if not isinstance(tag, AttemptTag) or attempt.verdict is None:
            return
        key = attempt.binding.id
        if attempt.verdict.outcome not in SERVING_OUTCOMES:
            # Failed attempts end here; a serving one stays in flight until settle.
            self._end_attempt(key, tag)
        if call.traffic != CUSTOMER:
            return  # Prism's own traffic is never evidence about customers' calls
        if not evidence:
            self.counters["breaker_stale_evidence"] += 1
            return
        self.after(
            self.machine.observe(
                key, self._observation(call, attempt, attempt.verdict, tag), self.clock()
            )
        )
        if self.machine.outbox:
            self.wake.set()

    def settle(self, call: Call, settlement: Settlement) -> None:
        for attempt in call.attempts:
            tag = attempt.extensions.get("breaker")
            if isinstance(tag, AttemptTag):
                self._end_attempt(attempt.binding.id, tag)
        state = call.extensions.get("breaker")
        if isinstance(state, CallState):
            for key, token in state.trials.items():
                self._release_trial(key, token)  # reserved but never reached
            state.trials.clear()

    def _end_attempt(self, key: str, tag: AttemptTag) -> None:
        if tag.in_flight:
            tag.in_flight = False
            health = self.machine.bindings.get(key) or self.machine.get(key, self.clock())
            health.in_flight -= 1
        if tag.trial_token is not None:
            self._release_trial(key, tag.trial_token)
            tag.trial_token = None

    @staticmethod
    def _observation(
        call: Call, attempt: Attempt, verdict: Verdict, tag: AttemptTag
    ) -> Observation:
        return Observation(
            outcome=verdict.outcome,
            revision=tag.revision,
            reason=verdict.reason,
            status=attempt.status,
            attempt_id=attempt.id,
            streaming=call.stream,
            first_byte_ms=attempt.first_byte_ms,
        )

    @staticmethod
    def _state_of(call: Call) -> CallState | None:
        """The call's state, if it needed one: most calls hold no trial and never stand down."""
        state = call.extensions.get("breaker")
        return state if isinstance(state, CallState) else None

    @staticmethod
    def _call_state(call: Call) -> CallState:
        state = call.extensions.get("breaker")
        if not isinstance(state, CallState):
            state = CallState()
            call.extensions["breaker"] = state
        return state
