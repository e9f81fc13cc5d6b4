"""prism-breaker: per-binding breakers and a persisted recovery state machine."""

from .machine import Admission, Machine, Observation, Snapshot, State, Transition
from .overrides import Override, OverrideError
from .plugin import BreakerHooks, breaker_of
from .runtime import HEADER, Breaker
from .settings import Settings
from .sqlite_store import SqliteStore
from .store import (
    STORE_ROLE,
    AuditEntry,
    BindingRecord,
    BindingReport,
    BreakerStore,
    Fleet,
    FleetView,
    StoredTransition,
    StoreProvider,
)
from .trackers import percentile

__all__ = [
    "HEADER",
    "STORE_ROLE",
    "Admission",
    "AuditEntry",
    "BindingRecord",
    "BindingReport",
    "Breaker",
    "BreakerHooks",
    "BreakerStore",
    "Fleet",
    "FleetView",
    "Machine",
    "Observation",
    "Override",
    "OverrideError",
    "Settings",
    "Snapshot",
    "SqliteStore",
    "State",
    "StoreProvider",
    "StoredTransition",
    "Transition",
    "breaker_of",
    "percentile",
]
