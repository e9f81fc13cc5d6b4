"""One gateway's breaker: the machine, the overrides, and the parts that work on them.

Kept across generations (one per state store), so a reload keeps every
binding's health; each generation's :class:`~prism_breaker.plugin.BreakerHooks`
hands it that generation's settings and catalog when the generation starts.
The work is split by responsibility:

- :class:`~.admission.CallAdmission`: the per-call hooks (which bindings a
  call may try, attempt tags, evidence), in memory only;
- :class:`~.sync.StoreSync`: the background task that writes transitions,
  re-reads what others wrote and, with a fleet (a store shared by several
  gateways), exchanges evidence with the others;
- :mod:`.reports`: ``/prism/health`` and the evidence audit rows keep;

and the breaker itself holds what they share and the operator's actions
(overrides, the holds a ``restore = "manual"`` line gets, probe verdicts).
"""

from __future__ import annotations

import collections
import logging
import random as random_module
from collections.abc import AsyncIterator, Callable
from typing import Any

from prism_proxy import AuditEntry, Binding, BreakerStore, Catalog, Fleet, Override

from .admission import CallAdmission
from .health import State, Transition
from .machine import Machine
from .overrides import OverrideBook, check_target, iso, new_override_id, subject
from .records import WallClock
from .reports import health_report, scope_evidence
from .settings import Settings
from .sync import StoreSync

__all__ = ["Breaker"]

log = logging.getLogger("prism.breaker")

MANUAL_HOLD = 'restore = "manual": the trial passed; release this hold to send traffic'


class Breaker:
    """One state store's breaker: what its parts share, and the operator's actions."""

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
        self.store = store
        self.counters: collections.Counter[str] = (
            counters if counters is not None else collections.Counter()
        )
        self.fleet: Fleet | None = store.fleet
        self.machine = Machine(settings, fleet=self.fleet is not None)
        self.overrides = OverrideBook()
        self.wall = WallClock.anchored(clock)
        #: What a probing plugin says of itself (allowance, pauses); None: no probes.
        self.probe_status: dict[str, Any] | None = None
        #: Which models use each binding (shown in health).
        self.used_by: dict[str, list[str]] = {}
        #: The generation whose catalog the breaker judges by, and its lines' fingerprints.
        self.generation = 0
        self.fingerprints: dict[str, str] = {}
        self.sync = StoreSync(self)
        self.admission = CallAdmission(
            self.machine,
            self.overrides,
            self.wall,
            clock,
            self.counters,
            self.fleet,
            self.sync.wake,
            self.hold_if_manual,
            random,
        )
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
        self.used_by = dict(used_by)
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

    # -- the store, through the sync ---------------------------------------------

    def lifecycle(self) -> AsyncIterator[None]:
        """Load state before serving, write it until (and while) the last generation stops."""
        return self.sync.lifecycle()

    async def flush(self) -> None:
        await self.sync.flush()

    async def refresh(self) -> None:
        await self.sync.refresh()

    @property
    def last_store_error(self) -> str | None:
        return self.sync.last_store_error

    # -- what other plugins see (prism_proxy.BreakerView) --------------------------

    def health(
        self, *, with_text: bool, capacity: Callable[[Binding], dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        """Every binding's state; ``capacity`` adds a limited line's slots and queue."""
        return health_report(self, with_text=with_text, capacity=capacity)

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
            self.sync.wake.set()

    # -- overrides ---------------------------------------------------------------

    def hold_if_manual(self, transition: Transition | None) -> None:
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
        self.sync.pending_holds.append(hold)
        self.counters["breaker_manual_holds"] += 1
        log.warning(
            "breaker: %s passed its trial; restore = manual: held by %s until "
            "`prism breaker release %s`",
            transition.binding,
            hold.id,
            hold.id,
        )
        self.sync.wake.set()

    async def add_override(self, override: Override) -> None:
        """Record and apply an operator override (raises OverrideError for a bad scope)."""
        check_target(override, self.catalog.bindings)
        entry = self.override_audit(
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
        entry = self.override_audit(found, "release", owner, reason, self.wall.now())
        ended = await self.store.end_override(override_id, entry)
        self.overrides.remove(override_id)
        return ended

    def override_audit(
        self, override: Override, action: str, actor: str, cause: str, at: float
    ) -> AuditEntry:
        return AuditEntry(
            at=at,
            actor=actor,
            action=action,
            subject=subject(override),
            cause=cause,
            evidence=scope_evidence(self, override),
            override_id=override.id,
        )
