"""The state store interface: what must survive a restart, and the audit log.

The gateway keeps the truth for routing in memory and writes here off the
hot path; it reads here at start-up and, periodically, to pick up overrides
written by someone else (the CLI, another replica).  :class:`BreakerStore`
is deliberately small so a Redis-backed store shared by several replicas
can replace the SQLite one without touching the state machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from .overrides import Override, iso

__all__ = ["AuditEntry", "BindingRecord", "BreakerStore", "StoredTransition"]


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

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso(self.at),
            "actor": self.actor,
            "action": self.action,
            "subject": self.subject,
            "from": self.from_state,
            "to": self.to_state,
            "cause": self.cause,
            "revision": self.revision,
            "override": self.override_id,
            "evidence": self.evidence,
        }


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

    async def record_transitions(self, transitions: Sequence[StoredTransition]) -> None: ...

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
