"""The breaker's state as other plugins see it: the store that keeps it, the records in it,
the fleet that shares it, and the view the breaker offers of itself.

prism-breaker keeps every binding's health; another plugin may keep that state
for it (prism-redis, for gateways that run as several processes) or read it
(prism-metrics, prism-probes).  The shapes they exchange live here, on the
core's public surface, so that no plugin imports another plugin's package.
Nothing here does I/O or holds state: the store and the fleet are protocols,
the records plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from .catalog import Binding

__all__ = [
    "BREAKER_ROLE",
    "STORE_ROLE",
    "AuditEntry",
    "BindingRecord",
    "BindingReport",
    "BreakerStore",
    "BreakerView",
    "Fleet",
    "FleetView",
    "Override",
    "OverrideKind",
    "OverrideScope",
    "StoreProvider",
    "StoredTransition",
]

#: Deprecated: the name a plugin registered its :class:`StoreProvider` under before
#: the ``BREAKER_STORE`` service (still read, with a warning, for one release).
STORE_ROLE = "breaker.store"
#: The name prism-breaker registers each generation's hooks under (other plugins
#: consume the ``BREAKER`` service instead of looking it up).
BREAKER_ROLE = "breaker.runtime"

OverrideKind = Literal["quarantine", "cap"]
OverrideScope = Literal["binding", "provider", "model"]


@attrs.frozen
class Override:
    """One operator decision.  Times are wall-clock epoch seconds (they outlive processes).

    ``scope`` is what ``target`` names: a binding id (``provider/model``), a
    provider, or an upstream model name (every binding serving it, on any
    provider).
    """

    id: str
    kind: OverrideKind
    scope: OverrideScope
    target: str
    reason: str
    owner: str
    created_at: float
    review_by: float
    expires_at: float | None = None
    max_in_flight: int | None = None

    def covers(self, binding: Binding) -> bool:
        if self.scope == "binding":
            return binding.id == self.target
        if self.scope == "provider":
            return binding.provider == self.target
        return binding.model == self.target

    def expired(self, wall_now: float) -> bool:
        return self.expires_at is not None and wall_now >= self.expires_at

    def review_overdue(self, wall_now: float) -> bool:
        return wall_now >= self.review_by


@attrs.frozen
class BindingRecord:
    """A binding's persisted state.  Times are wall-clock epoch seconds."""

    binding: str
    state: str
    cause: str
    since: float
    revision: int
    isolated_revision: int
    step: int
    isolated_until: float | None
    restored_at: float | None
    trial_since: float | None


@attrs.frozen
class AuditEntry:
    """One decision, automatic (actor ``breaker``) or manual (actor = the owner).

    ``action`` is ``transition``, ``quarantine``, ``cap``, ``release`` or
    ``expire``; ``subject`` a binding id, or ``provider:<name>`` / ``model:<name>``
    for an override of that scope (a binding-scoped override uses the id);
    ``evidence`` what the breaker knew at that moment (counts, rates,
    latency), never prompt text or credentials.
    """

    at: float
    actor: str
    action: str
    subject: str
    cause: str
    evidence: dict[str, Any] = attrs.field(factory=dict)
    from_state: str | None = None
    to_state: str | None = None
    revision: int | None = None
    override_id: str | None = None
    id: int | None = None


@attrs.frozen
class StoredTransition:
    """An automatic transition: its audit row and the binding's state after it."""

    audit: AuditEntry
    record: BindingRecord


class BreakerStore(Protocol):
    """Where breaker state and decisions are kept.  Every method may do I/O.

    Writes of one call are atomic: a transition's audit row and the binding's
    new state land together, as do an override and its audit row.
    """

    #: Shown in health output and errors, e.g. the file path.
    description: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def load_bindings(self) -> list[BindingRecord]: ...

    #: Fleet-wide coordination, when several gateways share this store; else None.
    fleet: Fleet | None

    async def record_transitions(
        self, transitions: Sequence[StoredTransition]
    ) -> Sequence[BindingRecord]:
        """Write automatic transitions, oldest first; returns the records that won instead.

        A shared store applies a transition only on top of the revision it
        was made from (or on a binding it has no record of).  When another
        gateway moved first, a trip from an open state (eligible or suspect)
        onto a stored open state still lands, renumbered after the stored
        revision; any other transition is not written.  Either way the later
        transitions of that binding in the batch are dropped and its stored
        record comes back, for the caller to adopt.  A transition whose record
        is stored already, exactly, is one of ours that landed though its
        answer was lost: it counts as landed (no second audit row) and the
        batch goes on.  A store with one writer returns nothing.
        """
        ...

    async def active_overrides(self) -> list[Override]:
        """Overrides not yet released or expired-and-recorded."""
        ...

    async def add_override(self, override: Override, audit: AuditEntry) -> None: ...

    async def end_override(self, override_id: str, audit: AuditEntry) -> Override | None:
        """End an active override (release or expiry); None when it is not active.

        Only the writer that actually ends it records ``audit``: two replicas
        expiring the same cap write one row.
        """
        ...

    async def audit(
        self, *, subjects: Sequence[str] | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        """Newest first; ``subjects`` keeps rows about those binding ids / ``scope:target``s."""
        ...

    async def changed(self) -> bool:
        """Did anyone else write since the last call?  Cheap; polled off the hot path."""
        ...


@attrs.frozen
class BindingReport:
    """What one gateway tells the fleet about a binding since its last report."""

    binding: str
    #: The binding's ``isolated_revision``: each isolation starts a fresh window.
    epoch: int
    #: New window entries: (wall-clock second, calls, failures).
    window: tuple[tuple[int, int, int], ...]
    #: Its own latency baseline now, by kind: (samples, median ms).
    latency: dict[str, tuple[int, float]]
    #: The trial it is counting successes for (its revision), and new successes.
    trial_revision: int | None = None
    trial_successes: int = 0


@attrs.frozen
class FleetView:
    """What the other gateways saw of a binding, as the fleet's reply to a report."""

    binding: str
    calls: int = 0
    failures: int = 0
    #: The other gateways' latency baselines, by kind: [(samples, median ms)].
    latency: dict[str, list[tuple[int, float]]] = attrs.field(factory=dict)
    #: Trial successes the whole fleet counted for the reported trial.
    trial_successes: int = 0


class Fleet(Protocol):
    """What a store shared by several gateways adds to the breaker.

    Every method may fail when the shared engine is unreachable; the breaker
    then decides from its own evidence alone until :attr:`healthy` is True
    again, and republishes its state so the fleet converges.
    """

    @property
    def healthy(self) -> bool:
        """False while the shared engine is unreachable."""
        ...

    #: How often the breaker exchanges reports with the fleet (seconds).
    interval_s: float

    async def exchange(
        self,
        reports: Sequence[BindingReport],
        *,
        now: float,
        window_s: float,
        latency_window_s: float,
    ) -> list[FleetView]:
        """Add this gateway's reports; return, per report, what the others saw in the
        ``window_s`` (``latency_window_s``) before ``now`` (wall-clock seconds)."""
        ...

    async def take_trial(
        self, binding: str, token: int, *, max_in_flight: int, lease_s: float, spacing_s: float
    ) -> bool:
        """One of the binding's fleet-wide trial slots, leased for ``lease_s``."""
        ...

    def end_trial(self, binding: str, token: int) -> None:
        """Give a trial slot back (in the background: it never blocks a call)."""
        ...

    async def republish(
        self, records: Sequence[BindingRecord], overrides: Sequence[Override]
    ) -> None:
        """Offer this gateway's state to a shared engine that may have lost it (a restart);
        a record older than the stored one and an override already there change nothing."""
        ...

    def watch(self, changed: Callable[[], None], back: Callable[[], None]) -> None:
        """Call ``changed`` when another gateway wrote, ``back`` when the engine returns."""
        ...


@runtime_checkable
class StoreProvider(Protocol):
    """A plugin's offer of a breaker store: the ``BREAKER_STORE`` service.

    (Registering it under :data:`STORE_ROLE` is deprecated.)
    """

    #: Identifies the store: breakers are kept per key across reloads.
    store_key: Hashable

    def breaker_store(self, settings: Any) -> BreakerStore:
        """The store for a breaker with ``settings`` (prism-breaker's ``Settings``)."""
        ...


@runtime_checkable
class BreakerView(Protocol):
    """What other plugins may ask of the breaker: the ``BREAKER`` service."""

    #: What a probing plugin says of itself (allowance, pauses), shown in the health
    #: report; None: no probes.
    probe_status: dict[str, Any] | None

    def health(
        self, *, with_text: bool, capacity: Callable[[Binding], dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        """Every binding's state, as ``GET /prism/health`` shows it; ``with_text`` adds the
        operators' words on overrides, ``capacity`` a limited line's slots and queue."""
        ...

    def probe_result(
        self, binding_id: str, passed: bool, detail: str, *, opens_trial: bool
    ) -> None:
        """A probe's verdict: shown in health, never customer evidence; a pass may open an
        isolated binding's trial early, a failure isolates it again one step further."""
        ...
