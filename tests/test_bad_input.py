"""Bad input gets a 4xx with an OpenAI-shaped body, a machine code and the field's name."""

from __future__ import annotations

import aiohttp
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]


def nested(levels: int) -> list:
    """An array ``levels`` deep: ``[[[]]]`` is 3."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def chat(**fields: object) -> dict:
    return {"model": "chat-a", "messages": MESSAGES, **fields}


def messages(*turns: dict, **fields: object) -> dict:
    return {"model": "chat-a", "max_tokens": 10, "messages": list(turns) or MESSAGES, **fields}


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}


@pytest.fixture
async def post(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog, config={"max_body_bytes": 4096})
    async with aiohttp.ClientSession() as session:

        async def send(
            path: str,
            data: bytes | None = None,
            json: object = None,
            content_type: str | None = "application/json",
        ):
            headers = {"Content-Type": content_type} if data is not None and content_type else {}
            async with session.post(
                gw.base_url + path, data=data, json=json, headers=headers
            ) as response:
                return response.status, await response.json(), response.headers

        yield send
    # No bad request may reach an upstream.
    assert prism_fake.hits("ok") == 0 and prism_fake.hits("err500") == 0


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        ("/chat/completions", {"messages": MESSAGES}, 400, "missing_field", "model"),
        ("/chat/completions", {"model": "chat-a"}, 400, "missing_field", "messages"),
        ("/chat/completions", {"model": 7, "messages": MESSAGES}, 400, "invalid_type", "model"),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": "hi"},
            400,
            "invalid_type",
            "messages",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": []},
            400,
            "invalid_value",
            "messages",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": [{"content": "x"}]},
            400,
            "invalid_type",
            "messages[0].role",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            "invalid_value",
            "messages[0].role",
        ),
        (
            "/chat/completions",
            {
                "model": "chat-a",
                "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}],
            },
            400,
            "invalid_value",
            "messages[0].content[0].type",
        ),
        (
            "/chat/completions",
            {
                "model": "chat-a",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}],
            },
            400,
            "invalid_type",
            "messages[0].content[1]",
        ),
        (
            "/messages",
            {
                "model": "chat-a",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "hologram"}]}],
            },
            400,
            "invalid_value",
            "messages[0].content[0].type",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": [{"role": "user", "content": 5}]},
            400,
            "invalid_type",
            "messages[0].content",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": MESSAGES, "stream": "yes"},
            400,
            "invalid_type",
            "stream",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": MESSAGES, "max_tokens": 0},
            400,
            "invalid_value",
            "max_tokens",
        ),
        (
            "/chat/completions",
            {"model": "chat-a", "messages": MESSAGES, "stream_options": {"include_usage": "y"}},
            400,
            "invalid_type",
            "stream_options.include_usage",
        ),
        (
            "/chat/completions",
            {"model": "gpt-nope", "messages": MESSAGES},
            404,
            "model_not_found",
            "model",
        ),
        # Beneath the top level: every member a translation reads, on any line.
        ("/chat/completions", chat(tools=[1]), 400, "invalid_type", "tools[0]"),
        (
            "/chat/completions",
            chat(tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}]),
            400,
            "invalid_type",
            "tools[0].function.parameters",
        ),
        (
            "/chat/completions",
            chat(tools=[{"type": "function"}]),
            400,
            "missing_field",
            "tools[0].function",
        ),
        (
            "/chat/completions",
            chat(tool_choice={"type": "function", "function": "f"}),
            400,
            "invalid_type",
            "tool_choice.function",
        ),
        ("/chat/completions", chat(stop=["a", 5]), 400, "invalid_type", "stop[1]"),
        ("/chat/completions", chat(user=7), 400, "invalid_type", "user"),
        ("/chat/completions", chat(modalities=3), 400, "invalid_type", "modalities"),
        (
            "/chat/completions",
            chat(response_format="json"),
            400,
            "invalid_type",
            "response_format",
        ),
        (
            "/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            400,
            "invalid_type",
            "messages[0].content[0].text",
        ),
        (
            "/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
            400,
            "invalid_type",
            "messages[0].content[0].image_url",
        ),
        (
            "/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": ["text"]}]}]),
            400,
            "invalid_type",
            "messages[0].content[0]",
        ),
        (
            "/chat/completions",
            chat(messages=[{"role": "assistant", "content": "x", "tool_calls": [1]}]),
            400,
            "invalid_type",
            "messages[0].tool_calls[0]",
        ),
        (
            "/chat/completions",
            chat(
                messages=[
                    {
                        "role": "assistant",
                        "tool_calls": [{**TOOL_CALL, "function": {"name": "f", "arguments": {}}}],
                    }
                ]
            ),
            400,
            "invalid_type",
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            "/chat/completions",
            chat(
                messages=[
                    {"role": "assistant", "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "tool_call_id": 5, "content": "sunny"},
                ]
            ),
            400,
            "invalid_type",
            "messages[1].tool_call_id",
        ),
        ("/messages", messages(tools=[1]), 400, "invalid_type", "tools[0]"),
        (
            "/messages",
            messages(tools=[{"name": "f", "input_schema": "object"}]),
            400,
            "invalid_type",
            "tools[0].input_schema",
        ),
        (
            "/messages",
            messages(
                {"role": "assistant", "content": [TOOL_USE]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": 5, "content": "sunny"}],
                },
            ),
            400,
            "invalid_type",
            "messages[1].content[0].tool_use_id",
        ),
        (
            "/messages",
            messages({"role": "assistant", "content": [{**TOOL_USE, "input": "{}"}]}),
            400,
            "invalid_type",
            "messages[0].content[0].input",
        ),
        (
            "/messages",
            messages({"role": "user", "content": [{"type": "image", "source": "x"}]}),
            400,
            "invalid_type",
            "messages[0].content[0].source",
        ),
        (
            "/messages",
            messages({"role": "user", "content": [{"type": {"text": "x"}}]}),
            400,
            "invalid_type",
            "messages[0].content[0]",
        ),
        (
            "/messages",
            messages(system=[{"type": "text", "text": 5}]),
            400,
            "invalid_type",
            "system[0].text",
        ),
        ("/messages", messages(system=[{"type": "image"}]), 400, "invalid_value", "system[0].type"),
        ("/messages", messages(stop_sequences=["a", 1]), 400, "invalid_type", "stop_sequences[1]"),
        ("/messages", messages(metadata={"user_id": 5}), 400, "invalid_type", "metadata.user_id"),
        (
            "/messages",
            messages(tool_choice={"type": "tool"}),
            400,
            "missing_field",
            "tool_choice.name",
        ),
        # Deeper than the request to the upstream could be written, in any field.
        ("/chat/completions", chat(x=nested(255)), 400, "body_too_deep", "x"),
        ("/chat/completions", chat(metadata={"a": nested(128)}), 400, "body_too_deep", "metadata"),
        ("/messages", messages(x={"y": nested(300)}), 400, "body_too_deep", "x"),
        (
            "/embeddings",
            {"model": "embed-a", "input": "x", "x": nested(200)},
            400,
            "body_too_deep",
            "x",
        ),
        ("/embeddings", {"model": "embed-a"}, 400, "missing_field", "input"),
        ("/embeddings", {"model": "embed-a", "input": []}, 400, "invalid_type", "input"),
        (
            "/embeddings",
            {"model": "embed-a", "input": "x", "encoding_format": "hex"},
            400,
            "invalid_value",
            "encoding_format",
        ),
    ],
)
async def test_invalid_fields_are_named(post, path, body, status, code, param):
    got_status, payload, headers = await post(path, json=body)
    assert got_status == status
    error = payload["error"]
    assert error["code"] == code
    assert error["param"] == param
    assert param.split("[")[0].split(".")[0] in error["message"]
    assert headers["x-prism-attempts"] == "0"
    assert headers["x-prism-request-id"].startswith("req_")


async def test_a_body_as_deep_as_the_limit_is_served(
    prism_fake, prism_gateway, catalog, prism_clock
):
    gw = await prism_gateway(catalog, clock=prism_clock)  # the retries' pauses take no time
    # The body is the first level, metadata the second: 128 in all.
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="chat-a", messages=MESSAGES, extra_body={"x": {"y": nested(126)}}
    )
    assert raw.http_response.status_code == 200
    assert prism_fake.requests("ok")[-1].body["x"] == {"y": nested(126)}


async def test_not_json(post):
    status, payload, _ = await post("/chat/completions", data=b"{not json")
    assert status == 400
    assert payload["error"]["code"] == "invalid_json"


async def test_json_but_not_an_object(post):
    status, payload, _ = await post("/chat/completions", data=b"[1, 2]")
    assert status == 400
    assert payload["error"]["code"] == "invalid_json"


async def test_body_over_the_limit(post):
    status, payload, _ = await post(
        "/chat/completions",
        json={"model": "chat-a", "messages": [{"role": "user", "content": "x" * 5000}]},
    )
    assert status == 413
    assert payload["error"]["code"] == "body_too_large"
    assert "4096" in payload["error"]["message"]


async def test_openai_sdk_sees_the_error(prism_fake, prism_gateway, catalog):
    import openai

    gw = await prism_gateway(catalog)
    with pytest.raises(openai.NotFoundError) as info:
        await gw.openai().chat.completions.create(model="gpt-nope", messages=MESSAGES)
    assert info.value.code == "model_not_found"
