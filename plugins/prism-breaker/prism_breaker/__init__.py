"""prism-breaker: per-binding breakers and a persisted recovery state machine."""

from .machine import Admission, Machine, Observation, Snapshot, State, Transition
from .overrides import Override, OverrideError
from .plugin import BreakerHooks, breaker_of
from .runtime import HEADER, Breaker
from .settings import Settings
from .sqlite_store import SqliteStore
from .store import AuditEntry, BindingRecord, BreakerStore, StoredTransition

__all__ = [
    "HEADER",
    "Admission",
    "AuditEntry",
    "BindingRecord",
    "Breaker",
    "BreakerHooks",
    "BreakerStore",
    "Machine",
    "Observation",
    "Override",
    "OverrideError",
    "Settings",
    "Snapshot",
    "SqliteStore",
    "State",
    "StoredTransition",
    "Transition",
    "breaker_of",
]
