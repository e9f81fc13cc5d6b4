"""Anthropic Messages and Responses callers reach a Bedrock line through chat.

prism-bedrock registers one translation (chat to Converse); the core composes
the others' translation to chat with it, streams included.
"""

from __future__ import annotations

import json

from prism_fake_upstream import Fault

from .bedrock_support import ANSWER, MODEL_ID, PLUGINS, WEATHER_TOOL

#: ``WEATHER_TOOL`` as Anthropic's Messages API declares it.
WEATHER = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}


async def test_an_anthropic_messages_caller_is_served(prism_fake, prism_gateway, catalog):
    prism_fake.script("ok", [Fault(usage={"cacheReadInputTokens": 4})])
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    message = await gw.anthropic().messages.create(
        model="m",
        max_tokens=200,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    assert message.type == "message"
    assert message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 9
    assert message.usage.cache_read_input_tokens == 4
    assert message.usage.input_tokens == 3  # the fresh part: 1 + 2 words
    [sent] = prism_fake.requests("ok")
    assert sent.path == f"model/{MODEL_ID}/converse"
    assert sent.body["system"] == [{"text": "Be brief."}]
    assert sent.body["inferenceConfig"] == {"maxTokens": 200}


async def test_an_anthropic_stream_with_a_tool_call(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    async with gw.anthropic().messages.stream(
        model="m",
        max_tokens=200,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = await stream.get_final_message()
    [block] = final.content
    assert block.type == "tool_use"
    assert block.name == "get_weather"
    assert block.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    [sent] = prism_fake.requests("ok")
    assert sent.path == f"model/{MODEL_ID}/converse-stream"
    assert sent.body["toolConfig"]["toolChoice"] == {"tool": {"name": "get_weather"}}


async def test_an_anthropic_text_stream(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=200, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == ANSWER
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 9


async def test_a_responses_caller_is_served(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    sdk = gw.openai()
    response = await sdk.responses.create(
        model="m", instructions="Be brief.", input="Hello", store=False
    )
    assert response.status == "completed"
    assert response.output_text == ANSWER
    assert response.usage.output_tokens == 9
    [sent] = prism_fake.requests("ok")
    assert sent.body["system"] == [{"text": "Be brief."}]
    assert sent.body["messages"] == [{"role": "user", "content": [{"text": "Hello"}]}]


async def test_a_streamed_responses_call_with_a_function_call(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    sdk = gw.openai()
    tool = {
        "type": "function",
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    stream = await sdk.responses.create(
        model="m", input="Weather in Paris?", tools=[tool], stream=True, store=False
    )
    events = [event async for event in stream]
    done = [e for e in events if e.type == "response.completed"]
    assert len(done) == 1
    [call] = [item for item in done[0].response.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    text_stream = await sdk.responses.create(model="m", input="Hello", stream=True, store=False)
    deltas = [e.delta async for e in text_stream if e.type == "response.output_text.delta"]
    assert "".join(deltas) == ANSWER
