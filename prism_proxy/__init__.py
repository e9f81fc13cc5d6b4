"""Prism: a pluggable LLM gateway.

This module is the public surface: plugins import from here and nowhere
else.  Everything in submodules not re-exported here is private and may
change without notice.
"""

from .accounting import output_cap
from .admin import ADMIN_HEADER, admin_handler, is_admin, require_admin
from .answers import error_response
from .app import create_app
from .background import background
from .breakerstate import (
    BREAKER_ROLE,
    STORE_ROLE,
    AuditEntry,
    BindingRecord,
    BindingReport,
    BreakerStore,
    BreakerView,
    Fleet,
    FleetView,
    Override,
    OverrideKind,
    OverrideScope,
    StoredTransition,
    StoreProvider,
)
from .call import (
    ANONYMOUS,
    SERVING_OUTCOMES,
    Attempt,
    Call,
    Endpoint,
    Outcome,
    Principal,
    Route,
    Settlement,
    Skip,
    UpstreamResult,
    Usage,
    Verdict,
)
from .capacity import Capacity, Slots
from .catalog import Binding, Catalog, CatalogKeys, ModelSpec, ProviderSpec, is_region
from .classification import (
    PERMANENT_MARKERS,
    find_permanent_marker,
    marker_code,
    parse_retry_after,
)
from .clock import Clock, LoopClock, ManualClock, Timer
from .commands import CheckLine, Command, Commands
from .config import Config, config_from_mapping, load_config
from .egress import ProxyError
from .endpoints import authenticated_call
from .errors import ConfigError, PrismError
from .gate import prompt_tokens
from .gateway import GATEWAY, Gateway
from .generation import Generation
from .hookimpl import hookimpl
from .orgs import OrgSetting, per_model_name, split_setting_name
from .percentiles import percentile
from .plugins import authenticating_plugins, declared_org_settings
from .principals import Principals
from .providers import (
    PARAM_RULE_KEYS,
    HttpProvider,
    ParamProfile,
    Provider,
    ProviderFactory,
    UpstreamResponse,
    check_param_rules,
    line_params,
    normalise_params,
)
from .selflink import INTERNAL_HEADER, SelfLink
from .services import (
    BREAKER,
    BREAKER_STORE,
    CAPACITY,
    PRICING,
    PRINCIPALS,
    SERVICES,
    SHARED_STATE,
    SPEND,
    TELEMETRY,
    Offer,
    Service,
    Services,
    SharedState,
    provide,
)
from .settings import (
    Section,
    Setting,
    read_settings,
    redact_url,
    setting,
    settings_of,
    settings_table,
)
from .spend import NANOS, Pricing, Spend, SpendLedger, SpendSnapshot, SpendTotals
from .telemetry import WORKERS_DIR_ENV, Telemetry
from .wire import ChunkKind, Translation, Wire, Wires

__all__ = [
    "ADMIN_HEADER",
    "ANONYMOUS",
    "BREAKER",
    "BREAKER_ROLE",
    "BREAKER_STORE",
    "CAPACITY",
    "GATEWAY",
    "INTERNAL_HEADER",
    "NANOS",
    "PARAM_RULE_KEYS",
    "PERMANENT_MARKERS",
    "PRICING",
    "PRINCIPALS",
    "SERVICES",
    "SERVING_OUTCOMES",
    "SHARED_STATE",
    "SPEND",
    "STORE_ROLE",
    "TELEMETRY",
    "WORKERS_DIR_ENV",
    "Attempt",
    "AuditEntry",
    "Binding",
    "BindingRecord",
    "BindingReport",
    "BreakerStore",
    "BreakerView",
    "Call",
    "Capacity",
    "Catalog",
    "Clock",
    "CatalogKeys",
    "CheckLine",
    "Command",
    "Commands",
    "Config",
    "ConfigError",
    "Endpoint",
    "Fleet",
    "FleetView",
    "Gateway",
    "Generation",
    "LoopClock",
    "HttpProvider",
    "ManualClock",
    "ModelSpec",
    "Offer",
    "OrgSetting",
    "Outcome",
    "Override",
    "OverrideKind",
    "OverrideScope",
    "ParamProfile",
    "Pricing",
    "Principal",
    "Principals",
    "PrismError",
    "Provider",
    "ProviderFactory",
    "ProviderSpec",
    "ProxyError",
    "Route",
    "SelfLink",
    "Section",
    "Service",
    "Services",
    "SharedState",
    "Setting",
    "Settlement",
    "Spend",
    "SpendLedger",
    "SpendSnapshot",
    "SpendTotals",
    "Skip",
    "Slots",
    "StoreProvider",
    "StoredTransition",
    "Telemetry",
    "Timer",
    "UpstreamResponse",
    "UpstreamResult",
    "Usage",
    "Verdict",
    "ChunkKind",
    "Translation",
    "Wire",
    "Wires",
    "admin_handler",
    "authenticated_call",
    "authenticating_plugins",
    "background",
    "check_param_rules",
    "config_from_mapping",
    "create_app",
    "declared_org_settings",
    "error_response",
    "find_permanent_marker",
    "hookimpl",
    "is_admin",
    "is_region",
    "line_params",
    "load_config",
    "marker_code",
    "normalise_params",
    "output_cap",
    "parse_retry_after",
    "provide",
    "per_model_name",
    "percentile",
    "prompt_tokens",
    "read_settings",
    "redact_url",
    "require_admin",
    "setting",
    "settings_of",
    "settings_table",
    "split_setting_name",
]
