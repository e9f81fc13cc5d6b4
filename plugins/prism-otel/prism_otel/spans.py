"""A call's spans, made when the call settles: one for the call, one per attempt.

Made after the fact with the times Prism measured (the call's arrival, each
attempt's start and verdict), so nothing is held open across awaits and the
hot path pays nothing until the end.  Attributes follow the OpenTelemetry
GenAI semantic conventions where they have a name (``gen_ai.*``), Prism's own
(``prism.*``) elsewhere; never prompt text, completion text or keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from prism_proxy import SERVING_OUTCOMES, Attempt, Call, Catalog, Settlement

__all__ = ["record_call"]

_OPERATION = {"chat": "chat", "messages": "chat", "embeddings": "embeddings"}
#: Request parameters worth a span attribute (numbers only: never text).
_PARAMS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
}


def record_call(
    provider: TracerProvider,
    propagator: TraceContextTextMapPropagator,
    catalog: Catalog,
    clock: Callable[[], float],
    call: Call,
    settlement: Settlement,
) -> None:
    tracer = provider.get_tracer("prism_otel")
    parent: Context = propagator.extract(carrier=call.request.headers)
    now_ns, now = time.time_ns(), clock()

    def wall(at: float) -> int:
        return now_ns - int((now - at) * 1e9)

    endpoint = str(call.endpoint)
    operation = _OPERATION.get(endpoint, endpoint)
    model = call.model.name if call.model is not None else None
    served = settlement.served
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "prism.request_id": call.request_id,
        "prism.endpoint": endpoint,
        "prism.outcome": settlement.outcome,
        "prism.attempts": len(call.attempts),
        "http.response.status_code": settlement.status,
    }
    if model is not None:
        attributes["gen_ai.request.model"] = model
    if call.route is not None:
        attributes["prism.route"] = call.route.name
    if settlement.error_code:
        attributes["prism.error_code"] = settlement.error_code
        attributes["error.type"] = settlement.error_code
    for key, name in _PARAMS.items():
        value = call.body.get(key)
        if type(value) in (int, float):
            attributes[name] = value
    if served is not None:
        attributes.update(_served(catalog, served))
    usage = settlement.usage
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
    span = tracer.start_span(
        f"{operation} {model}" if model else operation,
        context=parent,
        kind=SpanKind.SERVER,
        start_time=wall(call.received_at),
        attributes=attributes,
    )
    inside = trace.set_span_in_context(span, parent)
    for attempt in call.attempts:
        _attempt_span(tracer, catalog, inside, operation, attempt, served, wall, now)
    if settlement.outcome in ("ok", "empty"):
        span.set_status(Status(StatusCode.OK))
    else:
        span.set_status(Status(StatusCode.ERROR, settlement.error_code or settlement.outcome))
    span.end(end_time=now_ns)


def _served(catalog: Catalog, attempt: Attempt) -> dict[str, Any]:
    binding = attempt.binding
    out: dict[str, Any] = {
        "gen_ai.system": _system(catalog, binding.provider),
        "gen_ai.response.model": binding.model,
        "prism.binding": binding.id,
        "prism.provider": binding.provider,
    }
    if binding.region:
        out["prism.region"] = binding.region
    if attempt.finish_reason:
        out["gen_ai.response.finish_reasons"] = (attempt.finish_reason,)
    return out


def _system(catalog: Catalog, provider: str) -> str:
    spec = catalog.providers.get(provider)
    return spec.kind if spec is not None else provider


def _attempt_span(
    tracer: trace.Tracer,
    catalog: Catalog,
    parent: Context,
    operation: str,
    attempt: Attempt,
    served: Attempt | None,
    wall: Callable[[float], int],
    now: float,
) -> None:
    binding = attempt.binding
    verdict = attempt.verdict
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.system": _system(catalog, binding.provider),
        "gen_ai.request.model": binding.model,
        "prism.binding": binding.id,
        "prism.provider": binding.provider,
        "prism.attempt": attempt.number,
        "prism.verdict": str(verdict.outcome) if verdict is not None else "pending",
    }
    if binding.region:
        attributes["prism.region"] = binding.region
    if attempt.status is not None:
        attributes["http.response.status_code"] = attempt.status
    if attempt.first_byte_ms is not None:
        attributes["prism.first_byte_ms"] = round(attempt.first_byte_ms, 1)
    span = tracer.start_span(
        f"{operation} {binding.model}",
        context=parent,
        kind=SpanKind.CLIENT,
        start_time=wall(attempt.started_at),
        attributes=attributes,
    )
    if verdict is not None and verdict.outcome not in SERVING_OUTCOMES:
        span.set_attribute("error.type", str(verdict.outcome))
        span.set_status(Status(StatusCode.ERROR, verdict.reason or str(verdict.outcome)))
    # A serving attempt lasts until the answer is through; the others until their verdict.
    end = now if attempt is served else attempt.started_at + attempt.elapsed_ms / 1000
    span.end(end_time=wall(end))
