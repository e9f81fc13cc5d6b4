"""Bad input gets a 4xx with an OpenAI-shaped body, a machine code and the field's name."""

from __future__ import annotations

import aiohttp
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]


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
