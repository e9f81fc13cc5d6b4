"""The fake's Responses API, read by the official openai SDK as it reads OpenAI's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from prism_fake_upstream import FakeUpstream, Fault

TEXT = "Hello from m1. This is the fake upstream answering."
TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as running:
        yield running


def sdk(fake: FakeUpstream, scenario: str = "ok") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fake.base_url(scenario), api_key="x", max_retries=0)


async def test_a_whole_response_echoes_the_request(fake: FakeUpstream) -> None:
    response = await sdk(fake).responses.create(
        model="m1", input="Hi there", instructions="Be brief.", temperature=0.5
    )
    assert response.output_text == TEXT and response.status == "completed"
    assert response.instructions == "Be brief." and response.temperature == 0.5
    assert response.usage is not None and response.usage.input_tokens == 4
    assert response.usage.output_tokens == len(TEXT.split())


async def test_a_stream_is_the_typed_events_in_order(fake: FakeUpstream) -> None:
    stream = await sdk(fake).responses.create(model="m1", input="Hi", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == TEXT == events[-1].response.output_text


async def test_a_function_call_then_its_output(fake: FakeUpstream) -> None:
    client = sdk(fake)
    stream = await client.responses.create(model="m1", input="Weather?", tools=[TOOL], stream=True)
    events = [event async for event in stream]
    [call] = events[-1].response.output
    assert call.type == "function_call" and call.arguments == '{"city": "Paris"}'
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert arguments == call.arguments
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    answer = await client.responses.create(model="m1", input=[output], tools=[TOOL])
    assert answer.output_text == "The tool said: sunny"


async def test_reasoning_items_go_back_only_as_the_fake_sealed_them(fake: FakeUpstream) -> None:
    client = sdk(fake)
    first = await client.responses.create(model="m1", input="Think.", reasoning={"effort": "low"})
    reasoning, message = first.output
    assert message.type == "message"
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert first.usage is not None and first.usage.output_tokens_details.reasoning_tokens == 2
    again = [
        {"type": "message", "role": "user", "content": "Think."},
        reasoning.model_dump(exclude_none=True),
        {"type": "message", "role": "user", "content": "More."},
    ]
    assert (await client.responses.create(model="m1", input=again)).output_text == TEXT
    forged = {**again[1], "encrypted_content": "bm90IG1pbmU="}
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="m1", input=[again[0], forged])
    assert info.value.code == "invalid_encrypted_content"


async def test_limits_faults_and_state(fake: FakeUpstream) -> None:
    client = sdk(fake)
    cut = await client.responses.create(model="m1", input="Hi", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="m1", input="Hi", previous_response_id=cut.id)
    assert info.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        await sdk(fake, "ctx2").responses.create(model="m1", input="one two three")
    assert info.value.code == "context_length_exceeded"
    fake.script("told", [Fault(text="Scripted.")])
    assert (await sdk(fake, "told").responses.create(model="m1", input="x")).output_text == (
        "Scripted."
    )
    assert fake.hits("told", "responses") == 1
