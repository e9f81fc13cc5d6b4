"""prism-otel: OpenTelemetry spans per call and per attempt, exported over OTLP."""

from .plugin import HOOKS_NAME, OtelHooks, Tracing, tracing_of
from .settings import OtelSettings
from .spans import record_call

__all__ = ["HOOKS_NAME", "OtelHooks", "OtelSettings", "Tracing", "record_call", "tracing_of"]
