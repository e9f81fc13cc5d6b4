"""Both wire formats through the real gateway: each SDK served by each kind of binding.

The fake upstream speaks both APIs; each test names which binding served
(x-prism-provider) and what the upstream received.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from prism_fake_upstream import Fault

TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
            },
        },
    }
]
TOOLS_ANTHROPIC = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": TOOLS_OPENAI[0]["function"]["parameters"],
    }
]


def catalog(fake, *lines: tuple[str, str, str], **model: object) -> dict:
    """lines: (provider name, kind, scenario)."""
    providers = {
        name: {"kind": kind, "base_url": fake.base_url(scenario)} for name, kind, scenario in lines
    }
    return {
        "providers": providers,
        "models": {
            "m": {
                "chain": [{"provider": name, "model": f"up-{name}"} for name, _, _ in lines],
                **model,
            }
        },
    }


ANTHROPIC_LINE = ("claude", "anthropic", "claude-ok")


def anthropic_invalid_request(message: str) -> dict:
    """An Anthropic 400 body: the status and type say "your fault", the message may not."""
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


OPENAI_LINE = ("gpt", "openai", "gpt-ok")


@pytest.mark.parametrize("line", [ANTHROPIC_LINE, OPENAI_LINE], ids=["native", "translated"])
async def test_anthropic_sdk_plain(prism_fake, prism_gateway, line):
    gw = await prism_gateway(catalog(prism_fake, line))
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m",
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    message = await raw.parse()
    assert (
        message.content[0].text == f"Hello from up-{line[0]}. This is the fake upstream answering."
    )
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens > 0
    assert raw.headers["x-prism-provider"] == line[0]
    received = prism_fake.requests(line[2])[-1]
    assert received.path == ("messages" if line is ANTHROPIC_LINE else "chat/completions")
    if line is OPENAI_LINE:
        assert received.body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert received.body["max_tokens"] == 100


@pytest.mark.parametrize("line", [ANTHROPIC_LINE, OPENAI_LINE], ids=["native", "translated"])
async def test_anthropic_sdk_streaming(prism_fake, prism_gateway, line):
    gw = await prism_gateway(catalog(prism_fake, line))
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(texts) > 3
    assert "".join(texts) == f"Hello from up-{line[0]}. This is the fake upstream answering."
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(texts)


@pytest.mark.parametrize("line", [ANTHROPIC_LINE, OPENAI_LINE], ids=["native", "translated"])
@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_tool_use(prism_fake, prism_gateway, line, stream):
    gw = await prism_gateway(catalog(prism_fake, line))
    client = gw.anthropic()
    request = {
        "model": "m",
        "max_tokens": 200,
        "tools": TOOLS_ANTHROPIC,
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
    }
    if stream:
        async with client.messages.stream(**request) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(**request)
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    assert isinstance(call.input, dict) and call.input
    # The round trip: the tool's result goes back through the same translation.
    follow_up = await client.messages.create(
        model="m",
        max_tokens=200,
        tools=TOOLS_ANTHROPIC,
        messages=[
            *request["messages"],
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": "22 degrees and sunny",
                    }
                ],
            },
        ],
    )
    assert "22 degrees and sunny" in follow_up.content[0].text
    assert follow_up.stop_reason == "end_turn"


@pytest.mark.parametrize("line", [ANTHROPIC_LINE, OPENAI_LINE], ids=["translated", "native"])
@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_tool_round_trip(prism_fake, prism_gateway, line, stream):
    gw = await prism_gateway(catalog(prism_fake, line))
    client = gw.openai()
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    if stream:
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS_OPENAI, stream=True
            )
        ]
        calls: dict[int, dict] = {}
        finish = None
        for chunk in chunks:
            if not chunk.choices:
                continue
            finish = chunk.choices[0].finish_reason or finish
            for delta in chunk.choices[0].delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = delta.id or entry["id"]
                if delta.function and delta.function.name:
                    entry["name"] = delta.function.name
                if delta.function and delta.function.arguments:
                    entry["arguments"] += delta.function.arguments
        [tool] = calls.values()
        tool_call = {
            "id": tool["id"],
            "type": "function",
            "function": {"name": tool["name"], "arguments": tool["arguments"]},
        }
    else:
        completion = await client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS_OPENAI
        )
        finish = completion.choices[0].finish_reason
        [call] = completion.choices[0].message.tool_calls
        tool_call = call.model_dump()
    assert finish == "tool_calls"
    assert tool_call["function"]["name"] == "get_weather"
    assert json.loads(tool_call["function"]["arguments"])
    follow_up = await client.chat.completions.create(
        model="m",
        tools=TOOLS_OPENAI,
        messages=[
            *messages,
            {"role": "assistant", "content": None, "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": tool_call["id"], "content": "22 degrees and sunny"},
        ],
    )
    assert "22 degrees and sunny" in follow_up.choices[0].message.content
    assert follow_up.choices[0].finish_reason == "stop"


async def test_openai_sdk_served_by_an_anthropic_binding(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE))
    client = gw.openai()
    raw = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
    )
    completion = raw.parse()
    assert (
        completion.choices[0].message.content
        == "Hello from up-claude. This is the fake upstream answering."
    )
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens > 0
    assert raw.headers["x-prism-provider"] == "claude"
    assert raw.headers["x-prism-params-adjusted"] == "max_tokens defaulted to 4096"
    sent = prism_fake.requests("claude-ok")[-1]
    assert sent.body["system"] == "Be brief."
    assert sent.body["max_tokens"] == 4096

    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from up-claude. This is the fake upstream answering."
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize("endpoint", ["chat", "messages"])
@pytest.mark.parametrize("stream", [False, True])
async def test_failing_openai_binding_then_anthropic_serves(
    prism_fake, prism_gateway, endpoint, stream
):
    gw = await prism_gateway(
        catalog(prism_fake, ("gpt", "openai", "err503"), ANTHROPIC_LINE, retries=0)
    )
    if endpoint == "chat":
        raw = await gw.openai().chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], stream=stream
        )
        result = raw.parse()
        if stream:
            text = "".join([c.choices[0].delta.content or "" async for c in result if c.choices])
        else:
            text = result.choices[0].message.content
    else:
        raw = await gw.anthropic().messages.with_raw_response.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": "Hi"}], stream=stream
        )
        result = await raw.parse()
        if stream:
            text = "".join([e.delta.text async for e in result if e.type == "content_block_delta"])
        else:
            text = result.content[0].text
    assert text == "Hello from up-claude. This is the fake upstream answering."
    assert raw.headers["x-prism-provider"] == "claude"
    assert raw.headers["x-prism-attempt-log"].startswith("gpt/up-gpt transient 503")


async def test_anthropic_overloaded_529_fails_over_to_openai(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, ("claude", "anthropic", "err529"), OPENAI_LINE, retries=0)
    )
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    )
    assert raw.headers["x-prism-attempt-log"].startswith("claude/up-claude transient 529")
    assert (await raw.parse()).content[0].text.startswith("Hello from up-gpt")


async def test_anthropic_billing_400_is_permanent(prism_fake, prism_gateway):
    prism_fake.script(
        "claude-ok",
        [
            Fault(
                status=400,
                body=anthropic_invalid_request(
                    "Your credit balance is too low to access the Anthropic API."
                ),
            )
        ]
        * 3,
    )
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE, OPENAI_LINE))
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    )
    assert prism_fake.hits("claude-ok") == 1
    assert raw.headers["x-prism-attempt-log"].startswith("claude/up-claude permanent 400")


async def test_anthropic_request_error_reaches_an_openai_caller_in_its_own_shape(
    prism_fake, prism_gateway
):
    prism_fake.script(
        "claude-ok",
        [
            Fault(
                status=400,
                body=anthropic_invalid_request(
                    "prompt is too long: 250000 tokens > 200000 maximum"
                ),
            )
        ],
    )
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE, OPENAI_LINE))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert "prompt is too long" in info.value.message
    assert prism_fake.hits("gpt-ok") == 0


async def test_declared_drop_params_never_reach_the_upstream(prism_fake, prism_gateway):
    cat = catalog(prism_fake, OPENAI_LINE)
    cat["models"]["m"]["chain"][0].update(
        drop_params=["temperature"], rename_params={"max_tokens": "max_completion_tokens"}
    )
    gw = await prism_gateway(cat)
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], temperature=0.2, max_tokens=30
    )
    sent = prism_fake.requests("gpt-ok")[-1].body
    assert "temperature" not in sent
    assert sent["max_completion_tokens"] == 30 and "max_tokens" not in sent
    assert (
        raw.headers["x-prism-params-adjusted"]
        == "dropped temperature; renamed max_tokens to max_completion_tokens"
    )


async def test_untranslatable_request_skips_the_binding_that_cannot_take_it(
    prism_fake, prism_gateway
):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE, ANTHROPIC_LINE))
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m",
        max_tokens=2000,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Think."}],
    )
    assert raw.headers["x-prism-provider"] == "claude"
    assert raw.headers["x-prism-attempt-log"].startswith(
        "gpt/up-gpt skipped cannot express extended thinking"
    )
    assert prism_fake.hits("gpt-ok") == 0


async def test_nothing_in_the_chain_can_take_it_is_a_400(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    with pytest.raises(anthropic.BadRequestError) as info:
        await gw.anthropic().messages.create(
            model="m",
            max_tokens=2000,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "Think."}],
        )
    assert info.value.body["error"]["code"] == "no_compatible_binding"
    assert "extended thinking" in info.value.message
    assert prism_fake.hits("gpt-ok") == 0


async def test_embeddings_skip_anthropic_bindings(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE, OPENAI_LINE))
    raw = await gw.openai().embeddings.with_raw_response.create(model="m", input="x")
    assert raw.headers["x-prism-provider"] == "gpt"
    assert "claude/up-claude skipped" in raw.headers["x-prism-attempt-log"]


async def test_stream_death_after_content_is_an_anthropic_error_event(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "die3"), OPENAI_LINE))
    with pytest.raises(anthropic.APIError):
        async with gw.anthropic().messages.stream(
            model="m", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            async for _ in stream:
                pass
    assert prism_fake.hits("gpt-ok") == 0


async def test_messages_bad_input(prism_fake, prism_gateway):
    import aiohttp

    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/messages",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        ) as response:
            body = await response.json()
    assert response.status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "missing_field"
    assert body["error"]["param"] == "max_tokens"
    with pytest.raises(anthropic.NotFoundError):
        await gw.anthropic().messages.create(
            model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )


async def test_anthropic_sdk_model_list(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE))
    models = [m.id async for m in gw.anthropic().models.list()]
    assert models == ["m"]


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
HELLO = {"role": "user", "content": "Hello"}


@pytest.mark.parametrize("line", [ANTHROPIC_LINE, OPENAI_LINE], ids=["translated", "native"])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [1]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"messages": [HELLO, {"role": "assistant", "content": None, "tool_calls": [5]}]},
            "messages[1].tool_calls[0]",
        ),
        (
            {
                "messages": [
                    HELLO,
                    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "tool_call_id": 1, "content": "sunny"},
                ]
            },
            "messages[2].tool_call_id",
        ),
    ],
)
async def test_openai_sdk_malformed_tools_are_the_callers_400_on_any_line(
    prism_fake, prism_gateway, line, fields, param
):
    gw = await prism_gateway(catalog(prism_fake, line))
    request = {"model": "m", "messages": [HELLO], **fields}
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().chat.completions.create(**request)
    assert (info.value.code, info.value.param) == ("invalid_type", param)
    assert param in info.value.message
    assert prism_fake.hits(line[2]) == 0


@pytest.mark.parametrize("line", [ANTHROPIC_LINE, OPENAI_LINE], ids=["native", "translated"])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [1]}, "tools[0]"),
        ({"tools": [{"name": "f", "input_schema": ["object"]}]}, "tools[0].input_schema"),
        (
            {
                "messages": [
                    HELLO,
                    {"role": "assistant", "content": [TOOL_USE]},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": 7, "content": "sunny"}],
                    },
                ]
            },
            "messages[2].content[0].tool_use_id",
        ),
        ({"tool_choice": {"type": ["tool"]}}, "tool_choice.type"),
    ],
)
async def test_anthropic_sdk_malformed_tools_are_the_callers_400_on_any_line(
    prism_fake, prism_gateway, line, fields, param
):
    gw = await prism_gateway(catalog(prism_fake, line))
    request = {"model": "m", "max_tokens": 50, "messages": [HELLO], **fields}
    with pytest.raises(anthropic.BadRequestError) as info:
        await gw.anthropic().messages.create(**request)
    error = info.value.body["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_type",
        param,
    )
    assert prism_fake.hits(line[2]) == 0


async def test_tool_arguments_too_deep_to_translate_skip_the_binding(prism_fake, prism_gateway):
    # Arguments are a JSON text, not counted in the body's depth: parsed for
    # Anthropic's input, they would nest past what the request can be written with.
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE, OPENAI_LINE))
    arguments = '{"a": ' + "[" * 300 + "]" * 300 + "}"
    call = {**TOOL_CALL, "function": {"name": "f", "arguments": arguments}}
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m",
        messages=[
            HELLO,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    )
    assert raw.headers["x-prism-provider"] == "gpt"
    assert raw.headers["x-prism-attempt-log"].startswith(
        "claude/up-claude skipped cannot express tool call arguments nested more than 128"
    )
    assert prism_fake.hits("claude-ok") == 0
