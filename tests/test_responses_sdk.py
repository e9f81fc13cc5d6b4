"""OpenAI's Responses API through the real gateway, read by the official openai SDK.

Every call is served by translation: an OpenAI line receives a chat
completion request, an Anthropic line a Messages request (the fake upstream
records which), and the SDK gets Response objects and typed stream events.
"""

from __future__ import annotations

import json

import pytest
from prism_fake_upstream import Fault
from pydantic import BaseModel

from .responses_support import (
    ANTHROPIC_LINE,
    LINES,
    OPENAI_LINE,
    UPSTREAM_PATH,
    WEATHER_TOOL,
    answer,
    catalog,
    check_sequence,
    collect,
)


@pytest.mark.parametrize("line", LINES)
async def test_plain_text_answer(prism_fake, prism_gateway, line):
    gw = await prism_gateway(catalog(prism_fake, line))
    raw = await gw.openai().responses.with_raw_response.create(
        model="m", instructions="Be brief.", input="Hello", temperature=0.5, top_p=0.9
    )
    response = raw.parse()
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text == answer(line)
    [item] = response.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert response.usage.output_tokens == len(answer(line).split())
    assert response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert raw.headers["x-prism-provider"] == line[0]
    assert raw.headers["x-prism-attempts"] == "1"
    sent = prism_fake.requests(line[2])[-1]
    assert sent.path == UPSTREAM_PATH[line[1]]
    if line[1] == "openai":
        assert sent.body["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
        ]
    else:
        assert sent.body["system"] == "Be brief."
        assert sent.body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]}
        ]
    assert sent.body["temperature"] == 0.5 and sent.body["top_p"] == 0.9


@pytest.mark.parametrize("line", LINES)
async def test_streamed_text_events_in_order(prism_fake, prism_gateway, line):
    gw = await prism_gateway(catalog(prism_fake, line))
    events = await collect(
        await gw.openai().responses.create(model="m", input="Hello", stream=True)
    )
    check_sequence(events)
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert len(deltas) > 3 and "".join(deltas) == answer(line)
    done = events[-4]
    assert done.text == answer(line)
    completed = events[-1].response
    assert completed.status == "completed"
    assert completed.output_text == answer(line)
    assert completed.usage.output_tokens == len(deltas)
    assert completed.id == events[0].response.id
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {completed.output[0].id}


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_function_tool_round_trip(prism_fake, prism_gateway, line, stream):
    gw = await prism_gateway(catalog(prism_fake, line))
    client = gw.openai()
    question = [{"role": "user", "content": "What's the weather in Paris?"}]
    if stream:
        events = await collect(
            await client.responses.create(
                model="m", input=question, tools=[WEATHER_TOOL], stream=True
            )
        )
        check_sequence(events)
        types = [e.type for e in events]
        assert types[2] == "response.output_item.added"
        assert events[2].item.type == "function_call"
        assert types[-4:] == [
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert "".join(fragments) == events[-3].arguments
        output = events[-1].response.output
    else:
        output = (
            await client.responses.create(model="m", input=question, tools=[WEATHER_TOOL])
        ).output
    [call] = output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"location": "Paris"}
    assert call.call_id
    sent = prism_fake.requests(line[2])[-1].body
    assert sent["tools"][0]["name" if line[1] == "anthropic" else "function"]
    # The round trip: the call and its output go back as input items.
    follow_up = await client.responses.create(
        model="m",
        tools=[WEATHER_TOOL],
        input=[
            *question,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "22 and sunny"},
        ],
    )
    assert follow_up.status == "completed"
    assert follow_up.output_text == "The tool said: 22 and sunny"
    sent = prism_fake.requests(line[2])[-1].body
    if line[1] == "openai":
        assert sent["messages"][1]["tool_calls"][0]["id"] == call.call_id
        assert sent["messages"][2] == {
            "role": "tool",
            "tool_call_id": call.call_id,
            "content": "22 and sunny",
        }
    else:
        assert sent["messages"][1]["content"][0]["type"] == "tool_use"
        assert sent["messages"][2]["content"][0]["tool_use_id"] == call.call_id


async def test_forced_tool_choice_and_parallel_flag_reach_the_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE))
    other = {**WEATHER_TOOL, "name": "get_time"}
    response = await gw.openai().responses.create(
        model="m",
        input="Time?",
        tools=[WEATHER_TOOL, other],
        tool_choice={"type": "function", "name": "get_time"},
        parallel_tool_calls=False,
    )
    assert response.output[0].name == "get_time"
    sent = prism_fake.requests("claude-ok")[-1].body
    assert sent["tool_choice"] == {
        "type": "tool",
        "name": "get_time",
        "disable_parallel_tool_use": True,
    }


async def test_text_format_json_schema_reaches_an_openai_line(prism_fake, prism_gateway):
    prism_fake.script("gpt-ok", [Fault(text='{"city": "Paris", "degrees": 22}')])
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
        "required": ["city", "degrees"],
        "additionalProperties": False,
    }
    response = await gw.openai().responses.create(
        model="m",
        input="Weather in Paris as JSON",
        text={
            "format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}
        },
    )
    assert json.loads(response.output_text) == {"city": "Paris", "degrees": 22}
    sent = prism_fake.requests("gpt-ok")[-1].body
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": schema, "strict": True},
    }


async def test_json_object_format(prism_fake, prism_gateway):
    prism_fake.script("gpt-ok", [Fault(text='{"ok": true}')])
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    response = await gw.openai().responses.create(
        model="m", input="JSON please", text={"format": {"type": "json_object"}}
    )
    assert json.loads(response.output_text) == {"ok": True}
    assert prism_fake.requests("gpt-ok")[-1].body["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_max_output_tokens_gives_an_incomplete_response(
    prism_fake, prism_gateway, line, stream
):
    gw = await prism_gateway(catalog(prism_fake, line))
    client = gw.openai()
    if stream:
        events = await collect(
            await client.responses.create(
                model="m", input="Hello", max_output_tokens=3, stream=True
            )
        )
        check_sequence(events)
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    else:
        response = await client.responses.create(model="m", input="Hello", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == " ".join(answer(line).split()[:3])
    assert response.output[0].status == "incomplete"
    assert response.usage.output_tokens == 3
    sent = prism_fake.requests(line[2])[-1].body
    assert sent["max_completion_tokens" if line[1] == "openai" else "max_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_failing_first_line_fails_over(prism_fake, prism_gateway, stream):
    gw = await prism_gateway(
        catalog(prism_fake, ("gpt", "openai", "err503"), ANTHROPIC_LINE, retries=0)
    )
    raw = await gw.openai().responses.with_raw_response.create(model="m", input="Hi", stream=stream)
    result = raw.parse()
    if stream:
        events = await collect(result)
        check_sequence(events)
        text = events[-1].response.output_text
    else:
        text = result.output_text
    assert text == answer(ANTHROPIC_LINE)
    assert raw.headers["x-prism-provider"] == "claude"
    assert raw.headers["x-prism-attempts"] == "2"
    assert raw.headers["x-prism-attempt-log"].startswith("gpt/up-gpt transient 503")
    assert prism_fake.hits("err503") == 1


async def test_images_and_earlier_turns_are_carried(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE))
    pixel = "data:image/png;base64,iVBORw0KGgo="
    raw = await gw.openai().responses.with_raw_response.create(
        model="m",
        input=[
            {"role": "developer", "content": "Answer in French."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": pixel},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "A pixel.", "annotations": []}],
            },
            {"role": "user", "content": "Sure?"},
        ],
    )
    # A reasoning item cannot go to a Messages line: dropped, and said so.
    adjusted = raw.headers["x-prism-params-adjusted"].split("; ")
    assert adjusted == ["dropped reasoning items", "max_tokens defaulted to 4096"]
    sent = prism_fake.requests("claude-ok")[-1].body
    assert sent["system"] == "Answer in French."
    assert sent["messages"][0]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "A pixel."}],
    }
    assert sent["messages"][2]["content"] == [{"type": "text", "text": "Sure?"}]


class Weather(BaseModel):
    city: str
    degrees: int


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_sdk_parse_and_stream_helpers(prism_fake, prism_gateway, stream):
    """The SDK's own helpers rebuild the answer from the events (and parse it) themselves."""
    prism_fake.script("gpt-ok", [Fault(text='{"city": "Paris", "degrees": 22}')])
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    client = gw.openai()
    if stream:
        async with client.responses.stream(
            model="m", input="Weather?", text_format=Weather
        ) as events:
            texts = [e.delta async for e in events if e.type == "response.output_text.delta"]
            response = await events.get_final_response()
        assert "".join(texts) == '{"city": "Paris", "degrees": 22}'
    else:
        response = await client.responses.parse(model="m", input="Weather?", text_format=Weather)
    assert response.output_parsed == Weather(city="Paris", degrees=22)
    sent = prism_fake.requests("gpt-ok")[-1].body
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["name"] == "Weather"


IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
GATED = [
    pytest.param(
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "What?"}, IMAGE]}]},
        "vision",
        id="image",
    ),
    pytest.param(
        {"input": "JSON please", "text": {"format": {"type": "json_object"}}},
        "json_mode",
        id="text-format",
    ),
    pytest.param(
        {"input": [{"type": "function_call_output", "call_id": "c1", "output": "22"}]},
        "tools",
        id="tool-output",
    ),
]


@pytest.mark.parametrize(("request_", "capability"), GATED)
async def test_lines_that_cannot_take_what_is_used_are_skipped(
    prism_fake, prism_gateway, request_, capability
):
    """Capabilities are checked on Responses calls as on chat ones."""
    data = catalog(prism_fake, ("plain", "openai", "plain-ok"), OPENAI_LINE)
    data["models"]["m"]["chain"][0]["capabilities"] = []
    gw = await prism_gateway(data)
    raw = await gw.openai().responses.with_raw_response.create(model="m", **request_)
    assert raw.headers["x-prism-provider"] == "gpt"
    assert raw.headers["x-prism-attempt-log"].startswith(
        f"plain/up-plain skipped lacks {capability}"
    )
    assert prism_fake.hits("plain-ok") == 0
