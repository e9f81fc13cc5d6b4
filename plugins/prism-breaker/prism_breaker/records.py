"""The machine's values as the store keeps them: wall-clock records from monotonic snapshots.

The machine runs on the gateway's monotonic (injectable) clock; the store
keeps wall-clock epoch seconds, which outlive the process.  :class:`WallClock`
converts between the two, and the functions here turn a transition into its
stored row and a stored record back into a snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from prism_proxy import AuditEntry, BindingRecord, StoredTransition

from .health import Snapshot, State, Transition

__all__ = ["WallClock", "record_of", "snapshot_of", "stored"]


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


def stored(t: Transition, wall: WallClock) -> StoredTransition:
    """An automatic transition as the store writes it: its audit row and the new record."""
    return StoredTransition(
        audit=AuditEntry(
            at=wall.at(t.at),
            actor="breaker",
            action="transition",
            subject=t.binding,
            cause=t.cause,
            evidence=t.evidence,
            from_state=str(t.from_state),
            to_state=str(t.to_state),
            revision=t.revision,
        ),
        record=record_of(t.snapshot, wall),
    )


def record_of(s: Snapshot, wall: WallClock) -> BindingRecord:
    at = wall.at
    return BindingRecord(
        binding=s.binding,
        state=str(s.state),
        cause=s.cause,
        since=at(s.since),
        revision=s.revision,
        isolated_revision=s.isolated_revision,
        step=s.step,
        isolated_until=None if s.isolated_until is None else at(s.isolated_until),
        restored_at=None if s.restored_at is None else at(s.restored_at),
        trial_since=None if s.trial_since is None else at(s.trial_since),
    )


def snapshot_of(r: BindingRecord, wall: WallClock) -> Snapshot:
    mono = wall.mono_of
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
