"""One gateway's breaker: the machine, the overrides, the store writer, and the hook logic.

Kept across generations (one per state store), so a reload keeps every
binding's health; each generation's :class:`~prism_breaker.plugin.BreakerHooks`
hands it that generation's settings and catalog when the generation starts.
The hooks only touch memory; transitions queue in the machine's outbox and
a background task writes them, and re-reads overrides other writers made,
off the hot path.

With a store shared by several gateways (its ``fleet``), the background task
also exchanges window counts, latency baselines and trial successes with the
others and adopts the states they record; the one call that needs the fleet
at once is a trial attempt, which leases its slot there first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random as random_module
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import attrs

from prism_proxy import (
    SERVING_OUTCOMES,
    Attempt,
    Binding,
    Call,
    Catalog,
    ConfigError,
    Route,
    Settlement,
    Verdict,
)

from .machine import BindingHealth, Machine, Observation, Snapshot, State, Transition
from .overrides import Override, OverrideBook, check_target, iso, new_override_id
from .settings import Settings
from .sqlite_store import StoreError
from .store import (
    AuditEntry,
    BindingRecord,
    BindingReport,
    BreakerStore,
    Fleet,
    FleetView,
    StoredTransition,
)

__all__ = ["HEADER", "Breaker", "WallClock"]

log = logging.getLogger("prism.breaker")

HEADER = "x-prism-breaker"
#: Transitions kept for the store while it is failing, before the oldest are dropped.
MAX_PENDING = 10_000
#: How long shutdown waits for the state store to finish its writes.
STOP_TIMEOUT_S = 10.0
#: A ramping binding's share of calls starts here (Envoy's slow start has a floor too).
RAMP_FLOOR = 0.1
CUSTOMER = "customer"
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_ELIGIBLE = State.ELIGIBLE
MANUAL_HOLD = 'restore = "manual": the trial passed; release this hold to send traffic'


@attrs.define(eq=False)
class WallClock:
    """Wall-clock times derived from the gateway's (monotonic, injectable) clock.

    Anchored once, so a test's injected clock moves persisted and reported
    times too, and an isolation window survives a restart as a wall time.
    """

    mono: Callable[[], float]
    mono_anchor: float
    wall_anchor: float

    @classmethod
    def anchored(
        cls, mono: Callable[[], float], wall: Callable[[], float] = time.time
    ) -> WallClock:
        return cls(mono, mono(), wall())

    def now(self) -> float:
        return self.at(self.mono())

    def at(self, mono: float) -> float:
        return self.wall_anchor + (mono - self.mono_anchor)

    def mono_of(self, wall: float) -> float:
        return self.mono_anchor + (wall - self.wall_anchor)


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


class Breaker:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        clock: Callable[[], float],
        store: BreakerStore,
        counters: collections.Counter[str] | None = None,
        random: Callable[[], float] = random_module.random,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.clock = clock
        #: Decides which calls a ramping binding takes (tests inject their own).
        self.random = random
        self.store = store
        self.counters: collections.Counter[str] = (
            counters if counters is not None else collections.Counter()
        )
        self.fleet: Fleet | None = store.fleet
        self.machine = Machine(settings, fleet=self.fleet is not None)
        self.overrides = OverrideBook()
        self.wall = WallClock.anchored(clock)
        self.last_store_error: str | None = None
        self.dropped_transitions = 0
        self._wake = asyncio.Event()
        self._stopping = False
        self._flush_lock = asyncio.Lock()
        #: Transitions a failed write left behind, oldest first.
        self._retry: list[Transition] = []
        self._warned_overdue: set[str] = set()
        self._warned_soon: set[str] = set()
        #: Overrides the breaker set itself (a manual restore's hold), not yet stored.
        self._pending_overrides: list[Override] = []
        #: What a probing plugin says of itself (allowance, pauses); None: no probes.
        self.probe_status: dict[str, Any] | None = None
        #: Someone else wrote overrides (or, with a fleet, states) not read yet.
        self._overrides_stale = False
        self._records_stale = False
        #: The fleet's engine came back: offer it our state (it may have lost its own).
        self._republish = False
        self._used_by: dict[str, list[str]] = {}
        #: The generation whose catalog the breaker judges by, and its lines' fingerprints.
        self.generation = 0
        self.fingerprints: dict[str, str] = {}
        self.adopt(settings, catalog, 0)

    def adopt(self, settings: Settings, catalog: Catalog, generation: int) -> None:
        """Judge by a new generation's settings and catalog; health and overrides stay."""
        self.settings = settings
        self.machine.settings = settings
        self.catalog = catalog
        self.generation = generation
        self.fingerprints = {
            binding_id: catalog.fingerprint(binding)
            for binding_id, binding in catalog.bindings.items()
        }
        used_by: dict[str, list[str]] = collections.defaultdict(list)
        for model in catalog.models.values():
            for binding in model.chain:
                used_by[binding.id].append(model.name)
        self._used_by = dict(used_by)
        now = self.clock()
        for binding_id in catalog.bindings:
            self.machine.get(binding_id, now)

    def is_evidence(self, catalog: Catalog, binding: Binding) -> bool:
        """Whether an attempt made under ``catalog`` tells about ``binding`` as it is now.

        A completion from an older generation whose line changed since
        (another URL, model or credential) is about a binding that is gone.
        """
        if catalog is self.catalog:
            return True
        return self.fingerprints.get(binding.id) == catalog.fingerprint(binding)

    # -- lifecycle -------------------------------------------------------------

    async def lifecycle(self) -> AsyncIterator[None]:
        """Load state before serving, write it until (and while) the last generation stops."""
        try:
            await self.store.open()
        except StoreError as exc:
            raise ConfigError(
                self.settings.source, "[prism:breaker] state_path", str(exc)
            ) from None
        try:
            try:
                self.load(await self.store.load_bindings(), await self.store.active_overrides())
            except Exception:
                if self.fleet is None:
                    raise
                # A shared engine that is down must not keep the gateway from serving.
                log.warning(
                    "breaker: the shared state store %s is unreachable; serving on local "
                    "state until it answers",
                    self.store.description,
                )
                self._records_stale = self._overrides_stale = self._republish = True
            if self.fleet is not None:
                self.fleet.watch(self._fleet_changed, self._fleet_back)
            self._stopping = False
            task = asyncio.create_task(self._background(), name="prism-breaker")
            try:
                yield
            finally:
                # Stop between writes, never in the middle of one: a write cancelled
                # while queued for the worker thread could land after a newer one.
                self._stopping = True
                self._wake.set()
                try:
                    await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
                except TimeoutError:
                    log.error("breaker: the state store did not finish writing in time")
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                else:
                    await self._final_flush()
        finally:
            await self.store.close()

    async def _final_flush(self) -> None:
        """The last write, at shutdown: what a store that is down did not take is said
        in one WARNING, never raised (a clean stop must not end as a crash)."""
        try:
            await self.flush()
        except Exception as exc:
            log.warning(
                "breaker: the final state could not be %s (%s: %s: %s); changes not written: %d",
                "shared" if self.fleet is not None else "saved",
                self.store.description,
                type(exc).__name__,
                exc,
                len(self._retry) + len(self._pending_overrides),
            )

    def load(self, records: list[BindingRecord], overrides: list[Override]) -> None:
        now = self.clock()
        for binding_id in self.catalog.bindings:
            self.machine.get(binding_id, now)
        for r in records:
            if r.binding not in self.catalog.bindings:
                continue  # left the catalog; its rows stay for the audit trail
            self.machine.restore(self._snapshot_from(r), now)
            if r.state != State.ELIGIBLE:
                log.info("breaker: %s resumes as %s (%s)", r.binding, r.state, r.cause)
        self.overrides.replace(overrides)

    def _fleet_changed(self) -> None:
        self._records_stale = self._overrides_stale = True
        self._wake.set()

    def _fleet_back(self) -> None:
        self._records_stale = self._overrides_stale = self._republish = True
        self._wake.set()

    async def _background(self) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time()
        every_s = self.settings.refresh_s
        if self.fleet is not None:
            every_s = min(every_s, self.fleet.interval_s)
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), timeout=max(0.0, next_refresh - loop.time())
                )
            self._wake.clear()
            try:
                await self.flush()
                if self._stopping:
                    return
                if loop.time() >= next_refresh or self._records_stale:
                    next_refresh = loop.time() + every_s
                    await self.refresh()
            except Exception as exc:  # the store failing must not stop routing
                if self._stopping:
                    return  # the final flush tries once more, and says what is lost
                self._store_failed(exc)
                await asyncio.sleep(min(1.0, self.settings.refresh_s))

    def _store_failed(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if error != self.last_store_error:  # once per distinct error, not per retry
            if self.fleet is not None and not self.fleet.healthy:
                # The shared engine is away, and its link said so in a WARNING: a
                # traceback would only say it again.
                log.info(
                    "breaker: %s unreachable (%s); routing goes on from memory",
                    self.store.description,
                    error,
                )
            else:
                log.exception("breaker: state store failed; routing goes on from memory")
        self.last_store_error = error

    async def flush(self) -> None:
        """Write queued transitions; on failure keep them (bounded) for the next try."""
        async with self._flush_lock:
            fresh, self.machine.outbox = self.machine.outbox, []
            batch, self._retry = self._retry + fresh, []
            if not batch:
                await self._store_holds()
                return
            for t in fresh:  # logged once, even if the store makes us retry
                log.log(
                    logging.WARNING if t.to_state is State.ISOLATED else logging.INFO,
                    "breaker: %s %s -> %s (revision %d): %s",
                    t.binding,
                    t.from_state,
                    t.to_state,
                    t.revision,
                    t.cause,
                )
            try:
                beaten = await self.store.record_transitions([self._stored(t) for t in batch])
            except Exception:
                overflow = max(0, len(batch) - MAX_PENDING)
                self.dropped_transitions += overflow
                self._retry = batch[overflow:]
                raise
            self.last_store_error = None
            await self._store_holds()
            now = self.clock()
            for record in beaten:  # another gateway moved first: its state is the truth
                if self.machine.adopt(self._snapshot_from(record), now, force=True):
                    log.info(
                        "breaker: %s is %s (revision %d, recorded by another gateway)",
                        record.binding,
                        record.state,
                        record.revision,
                    )

    async def refresh(self) -> None:
        """Pick up overrides written elsewhere, move ended isolations to trial, end expired
        caps and warn about overrides past their review time."""
        if await self.store.changed():
            self._overrides_stale = True
            self._records_stale = self.fleet is not None
        if self._republish and self.fleet is not None:
            await self.fleet.republish(
                [self._stored_record(h.snapshot()) for h in self.machine.bindings.values()],
                list(self.overrides.active.values()),
            )
            self._republish = False
            log.info("breaker: the shared state store answers again; state republished")
        if self._records_stale:
            self._records_stale = False
            try:
                self._adopt_all(await self.store.load_bindings())
            except BaseException:
                self._records_stale = True
                raise
        if self._overrides_stale:
            # changed() reports a write once: remember it until the overrides are
            # read, so a refresh that fails here leaves the next one to read them.
            self.overrides.replace(await self.store.active_overrides())
            self._overrides_stale = False
        now = self.clock()
        for key in list(self.machine.bindings):
            # Record window ends as they happen, not only when traffic comes by.
            self.machine.tick(key, now)
        if self.fleet is not None:
            await self._exchange(self.fleet)
        wall_now = self.wall.at(now)
        for override in self.overrides.expired(wall_now):
            entry = self._override_audit(override, "expire", "breaker", "cap expired", wall_now)
            await self.store.end_override(override.id, entry)
            self.overrides.remove(override.id)
            log.info("breaker: %s on %s expired", override.describe(), _subject(override))
        warn_s = self.settings.review_warn_h * 3600
        for override in self.overrides.review_soon(wall_now, warn_s):
            if override.id not in self._warned_soon:
                self._warned_soon.add(override.id)
                log.warning(
                    "breaker: %s on %s (owner %s) is due for review in %.0f h (%s)",
                    override.describe(),
                    _subject(override),
                    override.owner,
                    (override.review_by - wall_now) / 3600,
                    iso(override.review_by),
                )
        for override in self.overrides.overdue(wall_now):
            if override.id not in self._warned_overdue:
                self._warned_overdue.add(override.id)
                log.warning(
                    "breaker: %s on %s (owner %s) is past its review time %s",
                    override.describe(),
                    _subject(override),
                    override.owner,
                    iso(override.review_by),
                )

    def _adopt_all(self, records: list[BindingRecord]) -> None:
        now = self.clock()
        for record in records:
            if record.binding not in self.catalog.bindings:
                continue
            if self.machine.adopt(self._snapshot_from(record), now):
                log.log(
                    logging.WARNING if record.state == State.ISOLATED else logging.INFO,
                    "breaker: %s is %s (revision %d, from the fleet): %s",
                    record.binding,
                    record.state,
                    record.revision,
                    record.cause,
                )

    async def _exchange(self, fleet: Fleet) -> None:
        """Tell the fleet what we saw, take in what the others saw, and judge by both.

        What a failed exchange carried is dropped, not retried: while the fleet
        is unreachable each gateway judges by its own evidence, and stale counts
        arriving later would only blur the window the fleet judges by then.
        """
        reports = [self._report(h) for h in self.machine.bindings.values()]
        try:
            views = await fleet.exchange(
                reports,
                now=self.wall.now(),
                window_s=self.settings.error_rate_window_s,
                latency_window_s=self.settings.latency_window_s,
            )
        except Exception:
            # Local-only decisions until the fleet answers: forget what others said.
            for h in self.machine.bindings.values():
                h.errors.others = (0, 0)
                for track in h.latency.values():
                    track.others = []
            raise
        now = self.clock()
        for view in views:
            self._take_view(view, now)
        if self.machine.outbox:
            self._wake.set()

    def _report(self, h: BindingHealth) -> BindingReport:
        """What ``h`` gathered since the last report (taken: it is not reported twice)."""
        window: dict[int, list[int]] = {}
        unsent, h.errors.unsent = h.errors.unsent or [], []
        for at, failed in unsent:
            bucket = window.setdefault(int(self.wall.at(at)), [0, 0])
            bucket[0] += 1
            bucket[1] += failed
        trial = h.state is State.TRIAL
        successes, h.trial_unsent = h.trial_unsent, 0
        latency = {}
        for kind, track in h.latency.items():
            median = track.own_median()
            if median is not None:
                latency[kind] = (len(track.sorted_baseline), median)
        return BindingReport(
            binding=h.binding,
            epoch=h.isolated_revision,
            window=tuple((second, c, f) for second, (c, f) in sorted(window.items())),
            latency=latency,
            trial_revision=h.trial_revision if trial else None,
            trial_successes=successes if trial else 0,
        )

    def _take_view(self, view: FleetView, now: float) -> None:
        h = self.machine.bindings.get(view.binding)
        if h is None:
            return
        h.errors.others = (view.calls, view.failures)
        for kind, track in h.latency.items():
            track.others = view.latency.get(kind, [])
        if h.state is State.TRIAL:
            h.trial_successes = max(h.trial_successes, view.trial_successes)
        self._after(self.machine.judge(view.binding, now))

    # -- hooks -----------------------------------------------------------------

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
            self._wake.set()

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
            share = self._ramp_share(self.machine.get(binding.id, now), now)
            if share < 1.0 and self.random() >= share:
                return f"breaker: ramping up ({share:.0%} of calls)", False, None
        return None, False, admission.trial_token

    def _ramp_share(self, h: BindingHealth, now: float) -> float:
        """The share of calls a binding restored ``ramp_s`` ago or less takes (slow start)."""
        ramp_s = self.settings.ramp_s
        if ramp_s <= 0 or h.restored_at is None or h.state not in (State.ELIGIBLE, State.SUSPECT):
            return 1.0
        elapsed = now - h.restored_at
        return 1.0 if elapsed >= ramp_s else max(RAMP_FLOOR, elapsed / ramp_s)

    def probe_result(
        self, binding_id: str, passed: bool, detail: str, *, opens_trial: bool
    ) -> None:
        """A probe's verdict (prism-probes): shown in health, never counted as customer
        evidence; a pass may open an isolated binding's trial early, a failure
        isolates an isolated or trial binding again, one step further."""
        now = self.clock()
        h = self.machine.get(binding_id, now)
        h.last_probe = {"at": iso(self.wall.at(now)), "passed": passed, "detail": detail}
        if passed:
            if opens_trial:
                self.machine.probe_passed(binding_id, detail, now)
        else:
            self.machine.probe_failed(binding_id, detail, now)
        if self.machine.outbox:
            self._wake.set()

    def _after(self, transition: Transition | None) -> None:
        """A trial that passed on a ``restore = "manual"`` line is held for an operator."""
        if (
            transition is None
            or transition.to_state is not State.ELIGIBLE
            or transition.from_state is not State.TRIAL
            or transition.binding not in self.settings.manual
        ):
            return
        wall_now = self.wall.now()
        hold = Override(
            id=new_override_id(),
            kind="quarantine",
            scope="binding",
            target=transition.binding,
            reason=MANUAL_HOLD,
            owner="breaker",
            created_at=wall_now,
            review_by=wall_now + self.settings.review_default_s,
        )
        self.overrides.add(hold)
        self._pending_overrides.append(hold)
        self.counters["breaker_manual_holds"] += 1
        log.warning(
            "breaker: %s passed its trial; restore = manual: held by %s until "
            "`prism breaker release %s`",
            transition.binding,
            hold.id,
            hold.id,
        )
        self._wake.set()

    async def _store_holds(self) -> None:
        while self._pending_overrides:
            hold = self._pending_overrides[0]
            entry = self._override_audit(
                hold, "quarantine", "breaker", hold.reason, hold.created_at
            )
            await self.store.add_override(hold, entry)
            self._pending_overrides.pop(0)

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
            self._wake.set()
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
            self._wake.set()

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
        self._after(
            self.machine.observe(
                key, self._observation(call, attempt, attempt.verdict, tag), self.clock()
            )
        )
        if self.machine.outbox:
            self._wake.set()

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

    # -- overrides ---------------------------------------------------------------

    async def add_override(self, override: Override) -> None:
        """Record and apply an operator override (raises OverrideError for a bad scope)."""
        check_target(override, self.catalog.bindings)
        entry = self._override_audit(
            override, override.kind, override.owner, override.reason, override.created_at
        )
        await self.store.add_override(override, entry)
        self.overrides.add(override)

    async def release_override(self, override_id: str, owner: str, reason: str) -> Override | None:
        found = self.overrides.active.get(override_id)
        if found is None:  # perhaps written elsewhere since the last refresh
            stored = await self.store.active_overrides()
            found = next((o for o in stored if o.id == override_id), None)
        if found is None:
            return None
        entry = self._override_audit(found, "release", owner, reason, self.wall.now())
        ended = await self.store.end_override(override_id, entry)
        self.overrides.remove(override_id)
        return ended

    def _override_audit(
        self, override: Override, action: str, actor: str, cause: str, at: float
    ) -> AuditEntry:
        return AuditEntry(
            at=at,
            actor=actor,
            action=action,
            subject=_subject(override),
            cause=cause,
            evidence=self._scope_evidence(override),
            override_id=override.id,
        )

    def _scope_evidence(self, override: Override) -> dict[str, Any]:
        """The state of every binding the override covers, at this moment."""
        now = self.clock()
        out: dict[str, Any] = {}
        for binding in self.catalog.bindings.values():
            if override.covers(binding):
                h = self.machine.tick(binding.id, now)
                out[binding.id] = {
                    "state": str(h.state),
                    "cause": h.cause,
                    "in_flight": h.in_flight,
                    **self.machine.evidence(h, now),
                }
        return {"bindings": out}

    def audit_subjects(self, binding: Binding) -> list[str]:
        return [binding.id, f"provider:{binding.provider}", f"model:{binding.model}"]

    # -- health ------------------------------------------------------------------

    def health(
        self, *, with_text: bool, capacity: Callable[[Binding], dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        """Every binding's state; ``capacity`` adds a limited line's slots and queue."""
        now = self.clock()
        wall_now = self.wall.at(now)
        bindings = []
        for binding in self.catalog.bindings.values():
            h = self.machine.tick(binding.id, now)
            overrides = self.overrides.for_binding(binding, wall_now)
            assessment = self.machine.assessment(h, now)
            if any(o.kind == "quarantine" for o in overrides):
                assessment = "unavailable"
            h.errors.prune(now)
            entry: dict[str, Any] = {
                "binding": binding.id,
                "provider": binding.provider,
                "model": binding.model,
                "used_by": self._used_by.get(binding.id, []),
                "state": str(h.state),
                "assessment": assessment,
                "cause": h.cause,
                "since": iso(self.wall.at(h.since)),
                "revision": h.revision,
                "isolated_until": (
                    iso(self.wall.at(h.isolated_until))
                    if h.state is State.ISOLATED and h.isolated_until is not None
                    else None
                ),
                "in_flight": h.in_flight,
                "capacity": capacity(binding) if capacity is not None else None,
                "consecutive_failures": h.consecutive,
                "counts": {**dict(sorted(h.counts.items())), "stale_ignored": h.stale},
                "window": {
                    "seconds": self.settings.error_rate_window_s,
                    "calls": h.errors.calls,
                    "failures": h.errors.failures,
                    "error_rate": round(h.errors.rate, 4),
                },
                "first_byte_ms": {
                    kind: track.percentiles(now) for kind, track in h.latency.items()
                },
                "overrides": [o.to_json(wall_now, with_text=with_text) for o in overrides],
            }
            share = self._ramp_share(h, now)
            if share < 1.0 and h.restored_at is not None:
                entry["ramp"] = {
                    "share": round(share, 3),
                    "left_s": round(self.settings.ramp_s - (now - h.restored_at), 1),
                }
            if h.last_probe is not None:
                entry["probe"] = h.last_probe
            if h.state is State.TRIAL:
                entry["trial"] = {
                    "successes": h.trial_successes,
                    "needed": self.settings.trial_min_successes,
                    "observed_s": round(now - (h.trial_since or now), 1),
                    "needed_s": self.settings.trial_min_duration_s,
                    "slots_in_use": len(h.leases),
                    "max_in_flight": self.settings.trial_max_in_flight,
                }
            bindings.append(entry)
        if self.machine.outbox:
            self._wake.set()
        overrides = sorted(self.overrides.active.values(), key=lambda o: o.created_at)
        return {
            "bindings": bindings,
            "overrides": [o.to_json(wall_now, with_text=with_text) for o in overrides],
            "overdue_reviews": [o.id for o in overrides if o.review_overdue(wall_now)],
            "reviews_due_soon": [
                o.id
                for o in self.overrides.review_soon(wall_now, self.settings.review_warn_h * 3600)
            ],
            "stand_downs": self.counters["breaker_stand_down"],
            "probes": self.probe_status,
            "store": {
                "where": self.store.description,
                "pending_writes": len(self.machine.outbox) + len(self._retry),
                "dropped_writes": self.dropped_transitions,
                "last_error": self.last_store_error,
                "shared": None if self.fleet is None else self.fleet.healthy,
            },
        }

    # -- persistence conversions -------------------------------------------------

    def _stored(self, t: Transition) -> StoredTransition:
        return StoredTransition(
            audit=AuditEntry(
                at=self.wall.at(t.at),
                actor="breaker",
                action="transition",
                subject=t.binding,
                cause=t.cause,
                evidence=t.evidence,
                from_state=str(t.from_state),
                to_state=str(t.to_state),
                revision=t.revision,
            ),
            record=self._stored_record(t.snapshot),
        )

    def _stored_record(self, s: Snapshot) -> BindingRecord:
        wall = self.wall.at
        return BindingRecord(
            binding=s.binding,
            state=str(s.state),
            cause=s.cause,
            since=wall(s.since),
            revision=s.revision,
            isolated_revision=s.isolated_revision,
            step=s.step,
            isolated_until=None if s.isolated_until is None else wall(s.isolated_until),
            restored_at=None if s.restored_at is None else wall(s.restored_at),
            trial_since=None if s.trial_since is None else wall(s.trial_since),
        )

    def _snapshot_from(self, r: BindingRecord) -> Snapshot:
        mono = self.wall.mono_of
        return Snapshot(
            binding=r.binding,
            state=State(r.state),
            cause=r.cause,
            since=mono(r.since),
            revision=r.revision,
            isolated_revision=r.isolated_revision,
            step=r.step,
            isolated_until=None if r.isolated_until is None else mono(r.isolated_until),
            restored_at=None if r.restored_at is None else mono(r.restored_at),
            trial_since=None if r.trial_since is None else mono(r.trial_since),
        )


def _subject(override: Override) -> str:
    if override.scope == "binding":
        return override.target
    return f"{override.scope}:{override.target}"
