"""The prism_proxy entry point ``otel``: a call's spans, exported over OTLP when configured.

Inactive without ``[prism:otel] endpoint`` (or ``enabled = true``: spans made
but sent nowhere, for an embedding app or a test that adds its own span
processor to ``tracing_of(generation).provider``).  Prism never touches the
global tracer provider: its spans go to its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from prism_proxy import Call, Catalog, Generation, Settlement, hookimpl

from .settings import SECTION, OtelSettings
from .spans import record_call

__all__ = ["HOOKS_NAME", "OtelHooks", "Tracing", "tracing_of"]

HOOKS_NAME = "otel.hooks"


class Tracing:
    """The tracer provider and its exporter; kept across generations, flushed at the end."""

    def __init__(self, settings: OtelSettings) -> None:
        self.settings = settings
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name})
        )
        if settings.endpoint is not None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=settings.endpoint),
                    schedule_delay_millis=settings.batch_delay_ms,
                )
            )
        self.propagator = TraceContextTextMapPropagator()

    async def lifecycle(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self.provider.shutdown()  # sends what is still queued


class OtelHooks:
    """One generation's tracing: its catalog (for provider kinds) and clock."""

    def __init__(self, tracing: Tracing, catalog: Catalog, clock: Callable[[], float]) -> None:
        self.tracing = tracing
        self.catalog = catalog
        self.clock = clock

    @property
    def provider(self) -> TracerProvider:
        return self.tracing.provider

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> Awaitable[None] | None:
        t = self.tracing
        record_call(t.provider, t.propagator, self.catalog, self.clock, call, settlement)
        return None


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = OtelSettings.from_config(generation.config)
    if settings is None:
        return
    tracing = generation.keep(("otel", settings), lambda: Tracing(settings))
    generation.register(OtelHooks(tracing, generation.catalog, generation.clock), HOOKS_NAME)


def tracing_of(generation: Generation) -> OtelHooks | None:
    hooks = generation.plugin(HOOKS_NAME)
    return hooks if isinstance(hooks, OtelHooks) else None


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: OtelSettings}
