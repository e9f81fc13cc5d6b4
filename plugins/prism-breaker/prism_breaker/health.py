"""What the state machine knows of one binding, and the values it takes and gives.

:class:`BindingHealth` is one binding's state and evidence; an
:class:`Observation` is a classified attempt going in, a :class:`Transition`
(with the :class:`Snapshot` that must survive a restart) and an
:class:`Admission` are what comes out.  Plain values: the rules that move
them are :mod:`.machine`'s.
"""

from __future__ import annotations

import enum
from collections import Counter
from typing import Any

import attrs

from prism_proxy import Outcome

from .trackers import ErrorWindow, LatencyTrack

__all__ = [
    "ADMITTED",
    "Admission",
    "BindingHealth",
    "Observation",
    "Snapshot",
    "State",
    "Transition",
]


class State(enum.StrEnum):
    ELIGIBLE = "eligible"
    SUSPECT = "suspect"
    ISOLATED = "isolated"
    TRIAL = "trial"


@attrs.define
class Observation:
    """One classified attempt, as the machine needs it (no body text, no prompt)."""

    outcome: Outcome
    #: The binding's revision when the attempt started (its identity in time).
    revision: int
    reason: str = ""
    status: int | None = None
    attempt_id: str = ""
    streaming: bool = False
    first_byte_ms: float | None = None


@attrs.frozen
class Snapshot:
    """What must survive a restart; times are on the machine's (monotonic) clock."""

    binding: str
    state: State
    cause: str
    since: float
    revision: int
    isolated_revision: int
    step: int
    isolated_until: float | None
    restored_at: float | None
    trial_since: float | None


@attrs.frozen
class Transition:
    binding: str
    from_state: State
    to_state: State
    cause: str
    #: The evidence at the moment of the decision (counts, rates, latency; no payloads).
    evidence: dict[str, Any]
    revision: int
    at: float
    snapshot: Snapshot


@attrs.frozen
class Admission:
    admitted: bool
    reason: str = ""
    #: Set when the caller was handed the binding's trial slot; release it when done.
    trial_token: int | None = None


ADMITTED = Admission(True)


@attrs.define(eq=False)
class BindingHealth:
    binding: str
    since: float
    errors: ErrorWindow
    latency: dict[str, LatencyTrack]
    state: State = State.ELIGIBLE
    cause: str = "no evidence yet"
    revision: int = 0
    #: Revision of the latest isolation: attempts started before it are never evidence.
    isolated_revision: int = 0
    trial_revision: int = 0
    #: Backoff step of the current series of trips (-1: never tripped).
    step: int = -1
    isolated_until: float | None = None
    restored_at: float | None = None
    trial_since: float | None = None
    trial_successes: int = 0
    next_slot_at: float = 0.0
    #: Trial slots handed out: token -> when the slot is reclaimed if never released.
    leases: dict[int, float] = attrs.field(factory=dict)
    consecutive: int = 0
    #: Trial successes not yet reported to the fleet.
    trial_unsent: int = 0
    #: The latest probe of this binding (never customer evidence): at, passed, detail.
    last_probe: dict[str, Any] | None = None
    counts: Counter[str] = attrs.field(factory=Counter)
    #: Completions ignored because they started before the latest isolation or trial.
    stale: int = 0
    #: Attempts in flight (maintained by the plugin: it sees starts and ends).
    in_flight: int = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(
            binding=self.binding,
            state=self.state,
            cause=self.cause,
            since=self.since,
            revision=self.revision,
            isolated_revision=self.isolated_revision,
            step=self.step,
            isolated_until=self.isolated_until,
            restored_at=self.restored_at,
            trial_since=self.trial_since,
        )
