"""OpenAI chat callers served by a Bedrock line: Converse and ConverseStream on the wire."""

from __future__ import annotations

import base64
import json

from prism_fake_upstream import Fault

from prism_proxy.testing import openai_tool_round_trip

from .bedrock_support import ANSWER, MODEL_ID, PLUGINS, WEATHER_TOOL


async def test_a_chat_completion_is_a_signed_converse_call(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi! How can I help?"},
            {"role": "user", "content": "Say hello again"},
        ],
        max_tokens=100,
        temperature=0.2,
        top_p=0.9,
        stop=["never-said"],
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == ANSWER
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == MODEL_ID
    # 2 + 1 + 5 + 3 words of prompt, 9 of answer.
    assert completion.usage.prompt_tokens == 11
    assert completion.usage.completion_tokens == 9
    assert raw.headers["x-prism-attempt-log"].startswith(f"ok/{MODEL_ID} ok 200 ")

    [sent] = prism_fake.requests("ok")
    # The model id's ':' is percent-encoded in the one path segment it is.
    assert sent.path == f"model/{MODEL_ID}/converse"
    assert sent.headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIA")
    assert "/us-east-1/bedrock/aws4_request" in sent.headers["Authorization"]
    assert sent.body == {
        "messages": [
            {"role": "user", "content": [{"text": "Hello"}]},
            {"role": "assistant", "content": [{"text": "Hi! How can I help?"}]},
            {"role": "user", "content": [{"text": "Say hello again"}]},
        ],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {
            "maxTokens": 100,
            "temperature": 0.2,
            "topP": 0.9,
            "stopSequences": ["never-said"],
        },
    }


async def test_a_streamed_chat_completion_reads_the_event_stream(
    prism_fake, prism_gateway, catalog
):
    prism_fake.script("ok", [Fault(usage={"cacheReadInputTokens": 7, "cacheWriteInputTokens": 2})])
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    stream = await gw.openai().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    usage = chunks[-1].usage
    # The whole prompt: 1 fresh + 7 read from the cache + 2 written to it.
    assert usage.prompt_tokens == 10
    assert usage.prompt_tokens_details.cached_tokens == 7
    assert usage.completion_tokens == 9
    [sent] = prism_fake.requests("ok")
    assert sent.path == f"model/{MODEL_ID}/converse-stream"
    assert sent.headers["Accept"] == "application/vnd.amazon.eventstream"
    assert "stream" not in sent.body


async def test_an_image_goes_as_bytes(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    data = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    await gw.openai().chat.completions.create(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                ],
            }
        ],
    )
    [sent] = prism_fake.requests("ok")
    assert sent.body["messages"][0]["content"] == [
        {"text": "What is this?"},
        {"image": {"format": "png", "source": {"bytes": data}}},
    ]


async def test_an_image_by_url_skips_the_line_saying_why(prism_fake, prism_gateway, catalog):
    import openai
    import pytest

    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    with pytest.raises(openai.BadRequestError) as caught:
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
    assert caught.value.code == "no_compatible_binding"
    assert "image by URL" in caught.value.message
    assert prism_fake.requests("ok") == []


async def test_tools_and_a_tool_result_round_trip(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    for stream in (False, True):
        trip = await openai_tool_round_trip(gw.openai(), WEATHER_TOOL, "Sunny, 21 C", stream=stream)
        assert trip.answer.choices[0].message.content == "The tool said: Sunny, 21 C"
        assert (trip.name, json.loads(trip.arguments)) == ("get_weather", {"city": "Paris"})
        call_id = trip.call_id
    first, second = prism_fake.requests("ok")[-2:]
    assert first.body["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "inputSchema": {"json": WEATHER_TOOL["function"]["parameters"]},
                }
            }
        ],
        "toolChoice": {"any": {}},
    }
    assert second.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "toolUse": {
                        "toolUseId": call_id,
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": call_id, "content": [{"text": "Sunny, 21 C"}]}}
            ],
        },
    ]


async def test_stop_reasons_become_finish_reasons(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    sdk = gw.openai()
    cut = await sdk.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.content == "Hello from anthropic.claude-3-5-sonnet-20240620-v1:0."
    stopped = await sdk.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], stop="fake"
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content.endswith("This is the ")


async def test_tool_choice_none_offers_no_tools(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "Hello"}],
        tools=[WEATHER_TOOL],
        tool_choice="none",
    )
    assert raw.parse().choices[0].message.content == ANSWER
    assert raw.headers["x-prism-params-adjusted"] == "tools left out for tool_choice none"
    [sent] = prism_fake.requests("ok")
    assert "toolConfig" not in sent.body


async def test_structured_output_skips_the_line(prism_fake, prism_gateway, catalog):
    import openai
    import pytest

    gw = await prism_gateway(catalog(("ok", MODEL_ID)), load_plugins=PLUGINS)
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.openai().chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Hello"}],
            response_format={"type": "json_object"},
        )
    assert caught.value.code == "no_compatible_binding"
    assert "response_format json_object" in caught.value.message
