"""Structured outputs on a line whose API has no such parameter (Anthropic), end to end.

The openai SDK's ``.parse()`` (chat and Responses, streamed and not) asks for
a pydantic model's schema; on an Anthropic line Prism sends it as a forced
tool and serves the tool's input as the message text.  An answer that is not
JSON or does not match the schema is a failed attempt: the chain goes on.
"""

from __future__ import annotations

import json

import orjson
import pytest
from prism_fake_upstream import Fault
from pydantic import BaseModel

from .responses_support import catalog


class City(BaseModel):
    name: str
    population: int


#: What the fake's tool rule fills the schema's required properties with.
FAKE_CITY = City(name="Paris", population=1)
LYON = City(name="Lyon", population=2)


MESSAGES = [{"role": "user", "content": "Which city? Answer in JSON."}]


def _claude_request(fake, scenario: str) -> dict:
    return fake.requests(scenario)[-1].body


def _assert_forced_tool(body: dict) -> None:
    assert body["tool_choice"] == {"type": "tool", "name": "json_answer"}
    (tool,) = body["tools"]
    assert tool["name"] == "json_answer"
    assert tool["input_schema"]["properties"]["population"]["type"] == "integer"
    assert "response_format" not in body


async def test_chat_parse_on_anthropic_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-chat")))
    raw = await gw.openai().chat.completions.with_raw_response.parse(
        model="m", messages=MESSAGES, response_format=City
    )
    completion = raw.parse()
    message = completion.choices[0].message
    assert message.parsed == FAKE_CITY
    assert json.loads(message.content) == FAKE_CITY.model_dump()
    assert message.tool_calls in (None, [])
    assert completion.choices[0].finish_reason == "stop"
    assert raw.headers["x-prism-provider"] == "claude"
    assert "response_format json_schema as a forced tool" in raw.headers["x-prism-params-adjusted"]
    _assert_forced_tool(_claude_request(prism_fake, "so-chat"))


async def test_chat_parse_streamed_on_anthropic_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-chat-stream")))
    deltas = []
    async with gw.openai().chat.completions.stream(
        model="m", messages=MESSAGES, response_format=City
    ) as stream:
        async for event in stream:
            if event.type == "content.delta":
                deltas.append(event.delta)
        final = await stream.get_final_completion()
    assert final.choices[0].message.parsed == FAKE_CITY
    # The tool's input_json_delta pieces arrive as content deltas.
    assert len(deltas) > 1
    assert json.loads("".join(deltas)) == FAKE_CITY.model_dump()
    body = _claude_request(prism_fake, "so-chat-stream")
    assert body["stream"] is True
    _assert_forced_tool(body)


async def test_json_object_on_anthropic_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-object")))
    prism_fake.script(
        "so-object",
        [
            Fault(
                body=_tool_message({"anything": ["goes", 1]}),
            )
        ],
    )
    completion = await gw.openai().chat.completions.create(
        model="m", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert json.loads(completion.choices[0].message.content) == {"anything": ["goes", 1]}
    body = _claude_request(prism_fake, "so-object")
    assert body["tools"][0]["input_schema"] == {"type": "object"}
    assert body["tool_choice"] == {"type": "tool", "name": "json_answer"}


async def test_responses_parse_on_anthropic_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-resp")))
    response = await gw.openai().responses.parse(
        model="m", input="Which city? Answer in JSON.", text_format=City
    )
    assert response.output_parsed == FAKE_CITY
    assert json.loads(response.output_text) == FAKE_CITY.model_dump()
    assert [item.type for item in response.output] == ["message"]
    _assert_forced_tool(_claude_request(prism_fake, "so-resp"))


async def test_responses_parse_streamed_on_anthropic_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-resp-stream")))
    deltas = []
    async with gw.openai().responses.stream(
        model="m", input="Which city? Answer in JSON.", text_format=City
    ) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert final.output_parsed == FAKE_CITY
    assert json.loads("".join(deltas)) == FAKE_CITY.model_dump()
    assert not any(item.type == "function_call" for item in final.output)
    _assert_forced_tool(_claude_request(prism_fake, "so-resp-stream"))


def _tool_message(arguments: dict) -> dict:
    """A whole Anthropic message that calls the answer tool with ``arguments``."""
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "up-claude",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "json_answer", "input": arguments}
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 5},
    }


def _tool_stream(partial_json: list[str]) -> bytes:
    """A whole Anthropic stream calling the answer tool with these input pieces."""

    def event(payload: dict) -> bytes:
        return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    message = {**_tool_message({}), "content": [], "stop_reason": None}
    events = [
        event({"type": "message_start", "message": message}),
        event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "json_answer",
                    "input": {},
                },
            }
        ),
        *(
            event(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
            )
            for piece in partial_json
        ),
        event({"type": "content_block_stop", "index": 0}),
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            }
        ),
        event({"type": "message_stop"}),
    ]
    return b"".join(events)


LYON_TEXT = Fault(text=LYON.model_dump_json())
BAD_ANSWERS = {
    "wrong-type": Fault(body=_tool_message({"name": "Paris", "population": "many"})),
    "missing-field": Fault(body=_tool_message({"name": "Paris"})),
    "plain-text": Fault(text="Paris, I think."),
}


@pytest.mark.parametrize("bad", sorted(BAD_ANSWERS))
async def test_answer_off_schema_fails_over(prism_fake, prism_gateway, bad):
    scenario = f"so-bad-{bad}"
    gw = await prism_gateway(
        catalog(
            prism_fake,
            ("claude", "anthropic", scenario),
            ("gpt", "openai", f"{scenario}-gpt"),
            retries=0,
        )
    )
    prism_fake.script(scenario, [BAD_ANSWERS[bad]])
    prism_fake.script(f"{scenario}-gpt", [LYON_TEXT])
    raw = await gw.openai().chat.completions.with_raw_response.parse(
        model="m", messages=MESSAGES, response_format=City
    )
    assert raw.parse().choices[0].message.parsed == LYON
    assert raw.headers["x-prism-provider"] == "gpt"
    log = raw.headers["x-prism-attempt-log"]
    assert log.startswith("claude/up-claude transient 200")
    assert "gpt/up-gpt ok 200" in log
    # The OpenAI line was sent the caller's response_format as it was.
    sent = prism_fake.requests(f"{scenario}-gpt")[-1].body
    assert sent["response_format"]["type"] == "json_schema"


async def test_streamed_answer_off_schema_fails_over(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(
            prism_fake,
            ("claude", "anthropic", "so-bad-stream"),
            ("gpt", "openai", "so-gpt-s"),
            retries=0,
        )
    )
    off_schema = _tool_stream(['{"name": "Paris",', ' "population": "many"}'])
    prism_fake.script("so-bad-stream", [Fault(body=off_schema)])
    prism_fake.script("so-gpt-s", [LYON_TEXT])
    async with gw.openai().chat.completions.stream(
        model="m", messages=MESSAGES, response_format=City
    ) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.parsed == LYON
    assert prism_fake.hits("so-bad-stream") == 1
    assert prism_fake.hits("so-gpt-s") == 1


async def test_only_line_off_schema_is_an_error_not_an_answer(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-only-bad"), retries=0))
    prism_fake.script("so-only-bad", [BAD_ANSWERS["wrong-type"]])
    client = gw.openai(max_retries=0)
    with pytest.raises(Exception) as info:
        await client.chat.completions.parse(model="m", messages=MESSAGES, response_format=City)
    assert getattr(info.value, "status_code", None) == 503
    assert getattr(info.value, "code", None) == "upstream_bad_answer"
    assert "population" in str(info.value)  # where it failed, never what was answered
    assert "many" not in str(info.value)


async def test_caller_tools_with_structured_output(prism_fake, prism_gateway):
    """With tools the model may call, it must call one or give the answer (tool_choice any)."""
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "so-tools")))
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "strict": True,
                "parameters": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                    "required": ["q"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    completion = await gw.openai().chat.completions.parse(
        model="m", messages=MESSAGES, response_format=City, tools=tools
    )
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup"  # the fake calls the first tool: passed on as a call
    body = _claude_request(prism_fake, "so-tools")
    assert body["tool_choice"] == {"type": "any"}
    assert [tool["name"] for tool in body["tools"]] == ["lookup", "json_answer"]
