"""prism-breaker: per-binding breakers and a persisted recovery state machine."""

# The store's protocols and records, and ``percentile``, are the core's
# (``prism_proxy``): other plugins share them from there.  They stay importable
# from here for the plugins and tests that did so.
from prism_proxy import (
    STORE_ROLE,
    AuditEntry,
    BindingRecord,
    BindingReport,
    BreakerStore,
    Fleet,
    FleetView,
    Override,
    StoredTransition,
    StoreProvider,
    percentile,
)

from .admission import HEADER
from .health import Admission, Observation, Snapshot, State, Transition
from .hooks import BreakerHooks, breaker_of, hooks_of
from .machine import Machine
from .overrides import OverrideError
from .runtime import Breaker
from .settings import Settings
from .sqlite_store import SqliteStore

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
    "hooks_of",
    "percentile",
]
