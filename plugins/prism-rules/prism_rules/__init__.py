"""prism-rules: conditional routing rules attached to catalog models."""

from .conditions import ConditionError, Context, compile_when
from .metadata import HEADER, MAX_BYTES, MAX_VALUES, read_metadata
from .plugin import PLUGIN_NAME, RoutingRules
from .rules import Rule, RuleBook, compile_catalog

__all__ = [
    "HEADER",
    "MAX_BYTES",
    "MAX_VALUES",
    "PLUGIN_NAME",
    "ConditionError",
    "Context",
    "Rule",
    "RoutingRules",
    "RuleBook",
    "compile_catalog",
    "compile_when",
    "read_metadata",
]
