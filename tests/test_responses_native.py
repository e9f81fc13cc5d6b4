"""A line that speaks the Responses API natively, read by the official openai SDK.

An ``openai`` provider with ``responses = "native"`` is sent ``POST
/responses`` as the caller wrote it (the fake upstream speaks the Responses
wire and records what it got), with ``store: false``: the gateway keeps the
conversation, reasoning items and their encrypted content included.  The
attempt log says ``native responses``; a failover onto an Anthropic line is
translated, and says so.
"""

from __future__ import annotations

from typing import Any

import pytest
from prism_fake_upstream import Fault

from .responses_support import (
    ANTHROPIC_LINE,
    OPENAI_LINE,
    WEATHER_TOOL,
    answer,
    catalog,
    check_sequence,
    collect,
    start,
)

NATIVE = (OPENAI_LINE[0],)
STREAMS = [pytest.param(False, id="whole"), pytest.param(True, id="streamed")]


def sent(fake: Any, scenario: str) -> tuple[str, dict[str, Any]]:
    """The path and body of the last request ``scenario`` received."""
    request = fake.requests(scenario)[-1]
    return request.path, request.body


async def create(gw: Any, stream: bool, **request: Any) -> tuple[Any, Any]:
    """The SDK's answer (its final Response when streamed) and the raw response."""
    raw = await gw.openai().responses.with_raw_response.create(model="m", stream=stream, **request)
    result = raw.parse()
    if not stream:
        return result, raw
    events = await collect(result)
    check_sequence(events)
    assert events[-1].type == "response.completed"
    assert len({event.response.id for event in events if hasattr(event, "response")}) == 1
    return events[-1].response, raw


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_native_line_is_sent_the_responses_api(prism_fake, prism_gateway, stream):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE, native=NATIVE))
    response, raw = await create(
        gw, stream, instructions="Be brief.", input="Hello", temperature=0.5, metadata={"k": "v"}
    )
    assert response.output_text == answer(OPENAI_LINE)
    assert response.id.startswith("resp_")
    assert response.usage.output_tokens == len(answer(OPENAI_LINE).split())
    # The caller's parameters, repeated; the caller's store, not the one sent upstream.
    assert response.instructions == "Be brief."
    assert response.temperature == 0.5 and response.metadata == {"k": "v"}
    assert response.store is True
    path, body = sent(prism_fake, "gpt-ok")
    assert path == "responses"
    assert body["store"] is False and body["input"] == "Hello" and body["model"] == "up-gpt"
    assert "stream_options" not in body
    assert raw.headers["x-prism-attempt-log"].endswith("ms native responses")
    assert prism_fake.hits("gpt-ok", "chat/completions") == 0


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_native_tool_call_round_trip(prism_fake, prism_gateway, stream):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE, native=NATIVE))
    first, _ = await create(gw, stream, input="Weather in Paris?", tools=[WEATHER_TOOL])
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments == '{"location": "Paris"}'
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second, _ = await create(
        gw, stream, previous_response_id=first.id, input=[output], tools=[WEATHER_TOOL]
    )
    assert second.output_text == "The tool said: sunny"
    assert second.previous_response_id == first.id
    _, body = sent(prism_fake, "gpt-ok")
    assert "previous_response_id" not in body
    assert [item["type"] for item in body["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]


@pytest.mark.parametrize("stream", STREAMS)
async def test_reasoning_survives_a_previous_response_id_round_trip(
    prism_fake, prism_gateway, stream
):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE, native=NATIVE))
    first, _ = await create(gw, stream, input="Think first.", reasoning={"effort": "low"})
    reasoning, message = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert message.type == "message"
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    _, body = sent(prism_fake, "gpt-ok")
    # With store false upstream, only the encrypted content carries reasoning on.
    assert body["include"] == ["reasoning.encrypted_content"]
    second, raw = await create(gw, stream, previous_response_id=first.id, input="Go on.")
    assert second.output_text == answer(OPENAI_LINE)
    _, body = sent(prism_fake, "gpt-ok")
    kept = [item for item in body["input"] if item["type"] == "reasoning"]
    assert [item["encrypted_content"] for item in kept] == [reasoning.encrypted_content]
    assert "x-prism-params-adjusted" not in raw.headers


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_failing_native_line_fails_over_to_an_anthropic_line(
    prism_fake, prism_gateway, stream
):
    gw = await prism_gateway(
        catalog(prism_fake, ("gpt", "openai", "err503"), ANTHROPIC_LINE, native=NATIVE, retries=0)
    )
    response, raw = await create(gw, stream, input="Hi", instructions="Be kind.")
    assert response.output_text == answer(ANTHROPIC_LINE)
    assert response.instructions == "Be kind."
    assert raw.headers["x-prism-provider"] == "claude"
    native, translated = raw.headers["x-prism-attempt-log"].split("; ")
    assert native.startswith("gpt/up-gpt transient 503") and native.endswith("native responses")
    assert translated.startswith("claude/up-claude ok 200")
    assert translated.endswith("translated to anthropic")
    assert sent(prism_fake, "err503")[0] == "responses"
    assert sent(prism_fake, "claude-ok")[0] == "messages"


async def test_encrypted_reasoning_stays_on_openai_lines_natively_or_not(prism_fake, prism_gateway):
    """Another OpenAI line may take the history (translated: its reasoning dropped)."""
    gw = await start(
        prism_gateway,
        catalog(prism_fake, OPENAI_LINE, ("mini", "openai", "mini-ok"), native=NATIVE),
    )
    first = await gw.openai().responses.create(model="m", input="Think.", reasoning={})
    prism_fake.script("gpt-ok", [Fault(status=503)] * 3)
    raw = await gw.openai().responses.with_raw_response.create(
        model="m", previous_response_id=first.id, input="Again."
    )
    assert raw.parse().output_text == answer(("mini", "openai", "mini-ok"))
    assert raw.headers["x-prism-params-adjusted"] == "dropped reasoning items"
    path, body = sent(prism_fake, "mini-ok")
    assert path == "chat/completions"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


async def test_a_native_context_refusal_moves_to_a_larger_line(prism_fake, prism_gateway):
    data = catalog(
        prism_fake, ("gpt", "openai", "ctx3"), ANTHROPIC_LINE, native=NATIVE, context_fallback=True
    )
    small, large = data["models"]["m"]["chain"]
    small["max_context_tokens"], large["max_context_tokens"] = 100, 200_000
    gw = await prism_gateway(data)
    raw = await gw.openai().responses.with_raw_response.create(
        model="m", input="one two three four five"
    )
    assert raw.parse().output_text == answer(ANTHROPIC_LINE)
    assert raw.headers["x-prism-fallback"] == "context"
    assert raw.headers["x-prism-attempt-log"].startswith("gpt/up-gpt request_error 400")


async def test_a_native_stream_broken_after_its_first_content_ends_with_failure_events(
    prism_fake, prism_gateway
):
    gw = await prism_gateway(catalog(prism_fake, ("gpt", "openai", "die3"), native=NATIVE))
    stream = await gw.openai().responses.create(model="m", input="Hello", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "upstream_stream_broken"
    assert failed.id == events[0].response.id
    delivered = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert delivered == " ".join(answer(OPENAI_LINE).split()[:3])
    assert failed.output[0].content[0].text == delivered
