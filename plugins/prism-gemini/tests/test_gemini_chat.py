"""OpenAI chat callers served by Gemini lines: text, streams, tools, images, usage, stops."""

from __future__ import annotations

import base64
import json

import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import openai_tool_round_trip

ANSWER = "Hello from gemini-g. This is the fake upstream answering."


async def test_a_chat_completion_is_served_by_a_gemini_line(prism_fake, start):
    gw = await start("g")
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi! What now?"},
            {"role": "user", "content": "Say hello again"},
        ],
        temperature=0.3,
        top_p=0.9,
        max_tokens=64,
        stop=["END"],
    )
    completion = raw.parse()
    assert raw.headers["x-prism-provider"] == "g"
    assert completion.choices[0].message.content == ANSWER
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens == 2 + 1 + 3 + 3
    assert completion.usage.completion_tokens == len(ANSWER.split())
    [request] = prism_fake.requests("g")
    assert request.path == "models/gemini-g:generateContent"
    assert request.headers["x-goog-api-key"] == "AIzaSy-test-secret-0123456789"
    assert request.body == {
        "contents": [
            {"role": "user", "parts": [{"text": "Hello"}]},
            {"role": "model", "parts": [{"text": "Hi! What now?"}]},
            {"role": "user", "parts": [{"text": "Say hello again"}]},
        ],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "maxOutputTokens": 64,
            "temperature": 0.3,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
    }


async def test_a_stream_is_relayed_chunk_by_chunk_with_usage(prism_fake, start):
    prism_fake.script("g", [Fault(thinking="one two three", usage={"cachedContentTokenCount": 1})])
    gw = await start("g")
    stream = await gw.openai().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hello there"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == len(
        ANSWER.split()
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    usage = chunks[-1].usage
    assert usage.prompt_tokens == 2
    assert usage.prompt_tokens_details.cached_tokens == 1
    # Gemini counts thinking apart; an OpenAI caller's completion tokens include it.
    assert usage.completion_tokens == len(ANSWER.split()) + 3
    assert usage.completion_tokens_details.reasoning_tokens == 3
    [request] = prism_fake.requests("g")
    assert request.path == "models/gemini-g:streamGenerateContent"
    assert "stream" not in request.body


async def test_an_image_goes_as_inline_data(prism_fake, start):
    png = base64.b64encode(b"\x89PNG fake image").decode()
    gw = await start("g")
    await gw.openai().chat.completions.create(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                ],
            }
        ],
    )
    [request] = prism_fake.requests("g")
    assert request.body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "What is this?"},
                {"inlineData": {"mimeType": "image/png", "data": png}},
            ],
        }
    ]


async def test_an_image_by_url_skips_the_line_with_the_reason(prism_fake, start):
    gw = await start("g")
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().chat.completions.create(
            model="m",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
                    ],
                }
            ],
        )
    assert info.value.body["code"] == "no_compatible_binding"
    assert "base64 data URL" in info.value.message
    assert prism_fake.hits("g") == 0


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_and_its_result_round_trip(prism_fake, start, stream):
    gw = await start("g")
    trip = await openai_tool_round_trip(gw.openai(), WEATHER, '{"temp_c": 21}', stream=stream)
    assert (trip.name, json.loads(trip.arguments)) == ("get_weather", {"city": "Paris"})
    assert trip.answer.choices[0].message.content == 'The tool said: {"temp_c":21}'
    first = prism_fake.requests("g")[0].body
    assert first["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parametersJsonSchema": WEATHER["function"]["parameters"],
                }
            ]
        }
    ]
    assert first["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    second = prism_fake.requests("g")[1].body
    call_part, response_part = second["contents"][1]["parts"][0], second["contents"][2]["parts"][0]
    assert call_part["functionCall"] == {"name": "get_weather", "args": {"city": "Paris"}}
    # The signature Gemini gave the call came back with it (the fake insists, as Gemini 3 does).
    assert len(base64.b64decode(call_part["thoughtSignature"])) == 48  # the fake's, not a stand-in
    assert response_part == {
        "functionResponse": {"name": "get_weather", "response": {"temp_c": 21}}
    }


async def test_a_named_tool_choice_allows_only_that_function(prism_fake, start):
    gw = await start("g")
    await gw.openai().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    [request] = prism_fake.requests("g")
    assert request.body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }


async def test_structured_output_asks_for_json_with_the_schema(prism_fake, start):
    prism_fake.script("g", [Fault(text='{"city": "Paris"}')])
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    gw = await start("g")
    completion = await gw.openai().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "A city"}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert json.loads(completion.choices[0].message.content) == {"city": "Paris"}
    [request] = prism_fake.requests("g")
    assert request.body["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
    }


async def test_max_tokens_stops_with_length(prism_fake, start):
    gw = await start("g")
    completion = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "Hello from gemini-g."


async def test_thinking_that_spends_the_budget_is_an_empty_answer(prism_fake, start, log):
    prism_fake.script("g", [Fault(empty_length=True)])
    gw = await start("g", "h", empty="fallback")
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    assert raw.headers["x-prism-provider"] == "h"
    assert log(raw.headers)[0] == ("g/gemini-g", "empty", "200")


async def test_what_gemini_cannot_express_skips_the_line(prism_fake, start):
    gw = await start("g")
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], logprobs=True
        )
    assert "logprobs" in info.value.message
    assert prism_fake.hits("g") == 0
