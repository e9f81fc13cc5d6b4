"""Spans per call and per attempt, checked with the SDK's in-memory exporter; OTLP export."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prism_fake_upstream import Fault
from prism_otel import tracing_of

from prism_proxy import GATEWAY, ConfigError, config_from_mapping, create_app
from prism_proxy.testing import free_port

PROMPT = "a prompt nobody may trace"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def catalog(fake) -> dict:
    return {
        "providers": {
            "x": {"kind": "openai", "base_url": fake.base_url("x")},
            "ok": {"kind": "openai", "base_url": fake.base_url("ok")},
        },
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": "x", "model": "up-x", "region": "eu-west-1"},
                    {"provider": "ok", "model": "up-ok", "region": "us-east-1"},
                ],
            }
        },
    }


async def traced(prism_gateway, fake, **otel):
    gw = await prism_gateway(
        catalog(fake),
        sections={"otel": otel or {"enabled": "true"}},
        load_plugins=["openai", "otel"],
    )
    memory = InMemorySpanExporter()
    hooks = tracing_of(gw.app[GATEWAY].current)
    assert hooks is not None
    hooks.provider.add_span_processor(SimpleSpanProcessor(memory))
    return gw, memory


async def post(url: str, headers: dict | None = None, **body) -> aiohttp.ClientResponse:
    payload = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], **body}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json=payload, headers=headers or {}
        ) as response:
            await response.read()
            return response


async def test_a_call_and_its_attempts_are_spans_in_the_callers_trace(prism_fake, prism_gateway):
    gw, memory = await traced(prism_gateway, prism_fake)
    prism_fake.script("x", [Fault(status=503)])
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    response = await post(gw.url, {"traceparent": traceparent}, max_tokens=50, temperature=0.2)
    assert response.status == 200

    spans = memory.get_finished_spans()
    server = next(s for s in spans if s.kind is SpanKind.SERVER)
    attempts = sorted((s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time)
    assert len(spans) == 3 and len(attempts) == 2
    # In the caller's trace, under the caller's span.
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == PARENT_ID
    assert all(a.parent.span_id == server.context.span_id for a in attempts)
    assert server.name == "chat m"
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m"
    assert a["gen_ai.system"] == "openai" and a["gen_ai.response.model"] == "up-ok"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert a["gen_ai.request.max_tokens"] == 50 and a["gen_ai.request.temperature"] == 0.2
    assert (a["prism.binding"], a["prism.region"], a["prism.route"]) == (
        "ok/up-ok",
        "us-east-1",
        "default",
    )
    assert a["prism.request_id"] == response.headers["x-prism-request-id"]
    assert server.status.status_code is StatusCode.OK

    failed, served = attempts
    assert failed.name == "chat up-x" and failed.attributes["prism.verdict"] == "transient"
    assert failed.attributes["http.response.status_code"] == 503
    assert failed.attributes["prism.region"] == "eu-west-1"
    assert failed.status.status_code is StatusCode.ERROR
    assert served.attributes["prism.verdict"] == "ok"
    assert server.start_time <= failed.start_time <= served.start_time <= server.end_time
    # Nothing a caller wrote, and no key.
    for span in spans:
        assert PROMPT not in str(dict(span.attributes))


async def test_without_a_traceparent_a_call_starts_its_own_trace(prism_fake, prism_gateway):
    gw, memory = await traced(prism_gateway, prism_fake)
    assert (await post(gw.url, model="nope")).status == 404
    (span,) = memory.get_finished_spans()
    assert span.parent is None
    assert span.attributes["prism.error_code"] == "model_not_found"
    assert "gen_ai.request.model" not in span.attributes  # the caller's string is not traced
    assert span.status.status_code is StatusCode.ERROR


async def test_a_stream_has_its_finish_reason_and_usage(prism_fake, prism_gateway):
    gw, memory = await traced(prism_gateway, prism_fake)
    assert (await post(gw.url, stream=True, stream_options={"include_usage": True})).status == 200
    server = next(s for s in memory.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert server.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert server.attributes["gen_ai.usage.output_tokens"] > 0


async def test_spans_are_exported_over_otlp_when_configured(prism_fake, prism_gateway):
    received: list[bytes] = []

    async def traces(request: web.Request) -> web.Response:
        assert request.headers["Content-Type"] == "application/x-protobuf"
        received.append(await request.read())
        return web.Response(status=200)

    collector = web.Application()
    collector.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(collector)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        gw = await prism_gateway(
            catalog(prism_fake),
            sections={
                "otel": {
                    "endpoint": f"http://127.0.0.1:{port}/v1/traces",
                    "service_name": "prism-test",
                    "batch_delay_ms": 50,
                }
            },
            load_plugins=["openai", "otel"],
        )
        assert (await post(gw.url)).status == 200
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.05)
        body = b"".join(received)
        assert b"prism-test" in body and b"chat m" in body and b"gen_ai.request.model" in body
        assert PROMPT.encode() not in body
    finally:
        await runner.cleanup()


def test_a_bad_endpoint_is_a_configuration_error():
    config = config_from_mapping(
        {}, {"otel": {"endpoint": "collector:4318"}}, catalog_data={"providers": {}, "models": {}}
    )
    with pytest.raises(ConfigError) as info:
        create_app(config)
    assert info.value.key == "[prism:otel] endpoint"
