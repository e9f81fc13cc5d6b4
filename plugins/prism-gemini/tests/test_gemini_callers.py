"""Anthropic Messages and Responses API callers on a Gemini line (translated through chat),
and OpenAI embeddings callers."""

from __future__ import annotations

import base64
import json
import struct

import pytest

ANSWER = "Hello from gemini-g. This is the fake upstream answering."
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def test_an_anthropic_caller_is_served_through_chat(prism_fake, start):
    gw = await start("g")
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m",
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    message = await raw.parse()
    assert raw.headers["x-prism-provider"] == "g"
    assert message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 3
    assert message.usage.output_tokens == len(ANSWER.split())
    [request] = prism_fake.requests("g")
    assert request.body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert request.body["generationConfig"] == {"maxOutputTokens": 100}


async def test_an_anthropic_stream_is_served_through_chat(prism_fake, start):
    gw = await start("g")
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        texts = [text async for text in stream.text_stream]
        message = await stream.get_final_message()
    assert "".join(texts) == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == len(ANSWER.split())


@pytest.mark.parametrize("stream", [False, True])
async def test_an_anthropic_tool_use_round_trips(prism_fake, start, stream):
    gw = await start("g")
    client = gw.anthropic()
    messages: list[dict] = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        async with client.messages.stream(
            model="m", max_tokens=100, messages=messages, tools=[TOOL]
        ) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[TOOL]
        )
    assert message.stop_reason == "tool_use"
    [use] = [block for block in message.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    answer = await client.messages.create(
        model="m", max_tokens=100, messages=messages, tools=[TOOL]
    )
    assert answer.content[0].text == 'The tool said: {"result":"sunny"}'
    parts = prism_fake.requests("g")[1].body["contents"][1]["parts"]
    assert len(base64.b64decode(parts[0]["thoughtSignature"])) == 48  # the one Gemini gave


async def test_a_responses_caller_is_served_through_chat(prism_fake, start):
    gw = await start("g")
    response = await gw.openai().responses.create(
        model="m", instructions="Be brief.", input="Hello", max_output_tokens=100
    )
    assert response.output_text == ANSWER
    assert response.status == "completed"
    assert response.usage.input_tokens == 3
    [request] = prism_fake.requests("g")
    assert request.body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert request.body["contents"] == [{"role": "user", "parts": [{"text": "Hello"}]}]


async def test_a_responses_stream_is_served_through_chat(prism_fake, start):
    gw = await start("g")
    stream = await gw.openai().responses.create(model="m", input="Hello", stream=True)
    events = [event async for event in stream]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ANSWER
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.output_tokens == len(ANSWER.split())


async def test_a_responses_function_call_comes_back(prism_fake, start):
    gw = await start("g")
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": TOOL["input_schema"],
        "strict": False,
    }
    response = await gw.openai().responses.create(model="m", input="Weather?", tools=[tool])
    [call] = [item for item in response.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})


def floats(encoded: str) -> list[float]:
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


async def test_embeddings_of_one_text(prism_fake, start):
    gw = await start("g")
    answer = await gw.openai().embeddings.create(model="m", input="hello world", dimensions=4)
    assert len(answer.data) == 1 and len(answer.data[0].embedding) == 4
    [request] = prism_fake.requests("g")
    assert request.path == "models/gemini-g:embedContent"
    assert request.body == {
        "content": {"parts": [{"text": "hello world"}]},
        "outputDimensionality": 4,
    }


async def test_embeddings_of_many_texts_in_both_encodings(prism_fake, start):
    gw = await start("g")
    client = gw.openai()
    plain = await client.embeddings.create(model="m", input=["a b", "c d"], encoding_format="float")
    packed = await client.embeddings.with_raw_response.create(
        model="m", input=["a b", "c d"], encoding_format="base64"
    )
    items = json.loads(packed.http_response.text)["data"]
    assert [item["index"] for item in items] == [0, 1]
    for item, float_item in zip(items, plain.data, strict=True):
        assert floats(item["embedding"]) == pytest.approx(float_item.embedding)
    request = prism_fake.requests("g")[0]
    assert request.path == "models/gemini-g:batchEmbedContents"
    assert request.body["requests"][1] == {
        "model": "models/gemini-g",
        "content": {"parts": [{"text": "c d"}]},
    }
    assert "encodingFormat" not in prism_fake.requests("g")[1].body


async def test_token_ids_cannot_be_embedded(prism_fake, start):
    import openai

    gw = await start("g")
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().embeddings.create(model="m", input=[[1, 2, 3]])
    assert "token ids" in info.value.message
    assert prism_fake.hits("g") == 0
