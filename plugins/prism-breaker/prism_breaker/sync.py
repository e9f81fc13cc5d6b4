"""The breaker's background work: the state store, and the fleet that shares it.

:class:`StoreSync` loads the stored state at start-up, then, off the hot path,
writes the transitions the machine queued (keeping them, bounded, while the
store fails), re-reads what others wrote (overrides from the CLI; with a
fleet, the states other gateways recorded), records window ends, ends
expired caps, warns about overrides due for review, and exchanges window
counts, latency baselines and trial successes with the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from prism_proxy import BindingRecord, BindingReport, ConfigError, Fleet, FleetView, Override

from .health import BindingHealth, State, Transition
from .overrides import describe, iso, subject
from .records import record_of, snapshot_of, stored
from .sqlite_store import StoreError

if TYPE_CHECKING:
    from .runtime import Breaker

__all__ = ["MAX_PENDING", "STOP_TIMEOUT_S", "StoreSync"]

log = logging.getLogger("prism.breaker")

#: Transitions kept for the store while it is failing, before the oldest are dropped.
MAX_PENDING = 10_000
#: How long shutdown waits for the state store to finish its writes.
STOP_TIMEOUT_S = 10.0


class StoreSync:
    """Writes the breaker's state to its store and keeps it in step with the others'."""

    def __init__(self, breaker: Breaker) -> None:
        # Settings, catalog and store are read through the breaker: a new generation
        # (or a test) replaces them there.  The rest is the breaker's for its lifetime.
        self.breaker = breaker
        self.machine = breaker.machine
        self.overrides = breaker.overrides
        self.wall = breaker.wall
        self.clock = breaker.clock
        self.fleet = breaker.fleet
        #: Set when there is something to write (or, from the fleet, to read).
        self.wake = asyncio.Event()
        #: Overrides the breaker set itself (a manual restore's hold), not yet stored.
        self.pending_holds: list[Override] = []
        self.last_store_error: str | None = None
        self.dropped_transitions = 0
        self._stopping = False
        self._flush_lock = asyncio.Lock()
        #: Transitions a failed write left behind, oldest first.
        self._retry: list[Transition] = []
        self._warned_overdue: set[str] = set()
        self._warned_soon: set[str] = set()
        #: Someone else wrote overrides (or, with a fleet, states) not read yet.
        self._overrides_stale = False
        self._records_stale = False
        #: The fleet's engine came back: offer it our state (it may have lost its own).
        self._republish = False

    @property
    def pending_writes(self) -> int:
        """Transitions not written yet: queued by the machine, or left by a failed write."""
        return len(self.machine.outbox) + len(self._retry)

    async def lifecycle(self) -> AsyncIterator[None]:
        """Load state before serving, write it until (and while) the last generation stops."""
        try:
            await self.breaker.store.open()
        except StoreError as exc:
            raise ConfigError(
                self.breaker.settings.source, "[prism:breaker] state_path", str(exc)
            ) from None
        try:
            try:
                store = self.breaker.store
                self.load(await store.load_bindings(), await store.active_overrides())
            except Exception:
                if self.fleet is None:
                    raise
                # A shared engine that is down must not keep the gateway from serving.
                log.warning(
                    "breaker: the shared state store %s is unreachable; serving on local "
                    "state until it answers",
                    self.breaker.store.description,
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
                self.wake.set()
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
            await self.breaker.store.close()

    async def _final_flush(self) -> None:
        """The last write, at shutdown: what a store that is down did not take is said
        in one WARNING, never raised (a clean stop must not end as a crash)."""
        try:
            await self.flush()
        except Exception as exc:
            log.warning(
                "breaker: the final state could not be %s (%s: %s: %s); changes not written: %d",
                "shared" if self.fleet is not None else "saved",
                self.breaker.store.description,
                type(exc).__name__,
                exc,
                len(self._retry) + len(self.pending_holds),
            )

    def load(self, records: list[BindingRecord], overrides: list[Override]) -> None:
        now = self.clock()
        for binding_id in self.breaker.catalog.bindings:
            self.machine.get(binding_id, now)
        for r in records:
            if r.binding not in self.breaker.catalog.bindings:
                continue  # left the catalog; its rows stay for the audit trail
            self.machine.restore(snapshot_of(r, self.wall), now)
            if r.state != State.ELIGIBLE:
                log.info("breaker: %s resumes as %s (%s)", r.binding, r.state, r.cause)
        self.overrides.replace(overrides)

    def _fleet_changed(self) -> None:
        self._records_stale = self._overrides_stale = True
        self.wake.set()

    def _fleet_back(self) -> None:
        self._records_stale = self._overrides_stale = self._republish = True
        self.wake.set()

    async def _background(self) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time()
        every_s = self.breaker.settings.refresh_s
        if self.fleet is not None:
            every_s = min(every_s, self.fleet.interval_s)
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.wake.wait(), timeout=max(0.0, next_refresh - loop.time())
                )
            self.wake.clear()
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
                await asyncio.sleep(min(1.0, self.breaker.settings.refresh_s))

    def _store_failed(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if error != self.last_store_error:  # once per distinct error, not per retry
            if self.fleet is not None and not self.fleet.healthy:
                # The shared engine is away, and its link said so in a WARNING: a
                # traceback would only say it again.
                log.info(
                    "breaker: %s unreachable (%s); routing goes on from memory",
                    self.breaker.store.description,
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
                beaten = await self.breaker.store.record_transitions(
                    [stored(t, self.wall) for t in batch]
                )
            except Exception:
                overflow = max(0, len(batch) - MAX_PENDING)
                self.dropped_transitions += overflow
                self._retry = batch[overflow:]
                raise
            self.last_store_error = None
            await self._store_holds()
            now = self.clock()
            for record in beaten:  # another gateway moved first: its state is the truth
                if self.machine.adopt(snapshot_of(record, self.wall), now, force=True):
                    log.info(
                        "breaker: %s is %s (revision %d, recorded by another gateway)",
                        record.binding,
                        record.state,
                        record.revision,
                    )

    async def refresh(self) -> None:
        """Pick up overrides written elsewhere, move ended isolations to trial, end expired
        caps and warn about overrides past their review time."""
        if await self.breaker.store.changed():
            self._overrides_stale = True
            self._records_stale = self.fleet is not None
        if self._republish and self.fleet is not None:
            await self.fleet.republish(
                [record_of(h.snapshot(), self.wall) for h in self.machine.bindings.values()],
                list(self.overrides.active.values()),
            )
            self._republish = False
            log.info("breaker: the shared state store answers again; state republished")
        if self._records_stale:
            self._records_stale = False
            try:
                self._adopt_all(await self.breaker.store.load_bindings())
            except BaseException:
                self._records_stale = True
                raise
        if self._overrides_stale:
            # changed() reports a write once: remember it until the overrides are
            # read, so a refresh that fails here leaves the next one to read them.
            self.overrides.replace(await self.breaker.store.active_overrides())
            self._overrides_stale = False
        now = self.clock()
        for key in list(self.machine.bindings):
            # Record window ends as they happen, not only when traffic comes by.
            self.machine.tick(key, now)
        if self.fleet is not None:
            await self._exchange(self.fleet)
        wall_now = self.wall.at(now)
        for override in self.overrides.expired(wall_now):
            entry = self.breaker.override_audit(
                override, "expire", "breaker", "cap expired", wall_now
            )
            await self.breaker.store.end_override(override.id, entry)
            self.overrides.remove(override.id)
            log.info("breaker: %s on %s expired", describe(override), subject(override))
        warn_s = self.breaker.settings.review_warn_h * 3600
        for override in self.overrides.review_soon(wall_now, warn_s):
            if override.id not in self._warned_soon:
                self._warned_soon.add(override.id)
                log.warning(
                    "breaker: %s on %s (owner %s) is due for review in %.0f h (%s)",
                    describe(override),
                    subject(override),
                    override.owner,
                    (override.review_by - wall_now) / 3600,
                    iso(override.review_by),
                )
        for override in self.overrides.overdue(wall_now):
            if override.id not in self._warned_overdue:
                self._warned_overdue.add(override.id)
                log.warning(
                    "breaker: %s on %s (owner %s) is past its review time %s",
                    describe(override),
                    subject(override),
                    override.owner,
                    iso(override.review_by),
                )

    def _adopt_all(self, records: list[BindingRecord]) -> None:
        now = self.clock()
        for record in records:
            if record.binding not in self.breaker.catalog.bindings:
                continue
            if self.machine.adopt(snapshot_of(record, self.wall), now):
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
                window_s=self.breaker.settings.error_rate_window_s,
                latency_window_s=self.breaker.settings.latency_window_s,
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
            self.wake.set()

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
        self.breaker.hold_if_manual(self.machine.judge(view.binding, now))

    async def _store_holds(self) -> None:
        while self.pending_holds:
            hold = self.pending_holds[0]
            entry = self.breaker.override_audit(
                hold, "quarantine", "breaker", hold.reason, hold.created_at
            )
            await self.breaker.store.add_override(hold, entry)
            self.pending_holds.pop(0)
