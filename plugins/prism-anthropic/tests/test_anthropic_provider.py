"""The anthropic provider kind against the fake upstream, through the real gateway.

Only this plugin is loaded (``load_plugins=["anthropic"]``): the catalogs
use no other provider kind, so nothing else installed can change what is
tested.  The provider's ``base_url`` is the API root ending in ``/v1``
(requests go to ``{base_url}/messages``), so it is the fake's ``base_url``,
not its ``anthropic_base_url`` (that one is for an SDK, which appends
``/v1/messages`` itself).
"""

from __future__ import annotations

import logging

import pytest

from prism_proxy import ConfigError

PLUGINS = ["anthropic"]
MESSAGES = [{"role": "user", "content": "Hello"}]
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["location"],
        },
    }
]


def catalog(provider: dict, model: str = "claude-up") -> dict:
    """Model ``m``, served by one anthropic binding ``p/<model>``."""
    return {
        "providers": {"p": {"kind": "anthropic", **provider}},
        "models": {"m": {"chain": [{"provider": "p", "model": model}]}},
    }


async def test_a_message_is_served_natively(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog({"base_url": prism_fake.base_url("ok")}), load_plugins=PLUGINS)
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=100, system="Be brief.", messages=MESSAGES
    )
    message = await raw.parse()
    assert message.content[0].text == "Hello from claude-up. This is the fake upstream answering."
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 3  # "Be brief." + "Hello", in words
    assert message.usage.output_tokens == 9
    assert raw.headers["x-prism-provider"] == "p"
    assert raw.headers["x-prism-model"] == "claude-up"
    assert raw.headers["x-prism-attempt-log"].startswith("p/claude-up ok 200 ")
    # Native: nothing translated, nothing adjusted.
    assert "x-prism-params-adjusted" not in raw.headers
    [seen] = prism_fake.requests("ok")
    assert seen.path == "messages"
    assert seen.body["model"] == "claude-up"  # the binding's model, not the caller's "m"
    assert seen.body["max_tokens"] == 100
    assert seen.body["system"] == "Be brief."
    assert seen.body["messages"] == MESSAGES
    assert "stream" not in seen.body or seen.body["stream"] is False


async def test_a_streamed_message_is_relayed_event_by_event(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog({"base_url": prism_fake.base_url("ok")}), load_plugins=PLUGINS)
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=100, messages=MESSAGES
    ) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(texts) == 9  # one text_delta per word token
    assert "".join(texts) == "Hello from claude-up. This is the fake upstream answering."
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 9
    [seen] = prism_fake.requests("ok")
    assert seen.path == "messages"
    assert seen.body["stream"] is True
    assert seen.body["model"] == "claude-up"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_tool_use_is_served_natively(prism_fake, prism_gateway, stream):
    gw = await prism_gateway(catalog({"base_url": prism_fake.base_url("ok")}), load_plugins=PLUGINS)
    client = gw.anthropic()
    request = {
        "model": "m",
        "max_tokens": 200,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
    }
    if stream:
        async with client.messages.stream(**request) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(**request)
    assert message.stop_reason == "tool_use"
    [call] = message.content
    assert call.type == "tool_use"
    assert call.name == "get_weather"
    assert call.input == {"location": "Paris"}
    assert call.id.startswith("toolu_")
    # The tool definitions reach the upstream as the caller wrote them.
    assert prism_fake.requests("ok")[0].body["tools"] == TOOLS

    # The round trip: the tool's result goes back through the same binding.
    follow_up = await client.messages.create(
        model="m",
        max_tokens=200,
        tools=TOOLS,
        messages=[
            *request["messages"],
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "22 degrees"}
                ],
            },
        ],
    )
    assert follow_up.content[0].text == "The tool said: 22 degrees"
    assert follow_up.stop_reason == "end_turn"
    assert prism_fake.hits("ok", "messages") == 2


async def test_the_upstream_gets_the_providers_headers_not_the_callers(
    prism_fake, prism_gateway, monkeypatch
):
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-test-123")
    gw = await prism_gateway(
        catalog(
            {
                "base_url": prism_fake.base_url("ok"),
                "api_key_env": "TEST_ANTHROPIC_KEY",
                "beta": ["prompt-caching-2024-07-31", "output-128k-2025-02-19"],
                "headers": {"x-team": "search"},
            }
        ),
        load_plugins=PLUGINS,
    )
    await gw.anthropic(api_key="caller-key").messages.create(
        model="m", max_tokens=10, messages=MESSAGES
    )
    [seen] = prism_fake.requests("ok")
    assert seen.headers["x-api-key"] == "sk-ant-test-123"
    assert seen.headers["anthropic-version"] == "2023-06-01"  # the default
    assert seen.headers["anthropic-beta"] == "prompt-caching-2024-07-31,output-128k-2025-02-19"
    assert seen.headers["x-team"] == "search"
    assert seen.headers["Content-Type"] == "application/json"
    # The gateway names itself upstream, never the caller's SDK, and never
    # passes the caller's own key on.
    assert seen.headers["User-Agent"].startswith("prism-llm-gateway/")
    assert "caller-key" not in str(dict(seen.headers))
    assert "Authorization" not in seen.headers


async def test_anthropic_version_is_the_configured_one(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog({"base_url": prism_fake.base_url("ok"), "anthropic_version": "2099-12-31"}),
        load_plugins=PLUGINS,
    )
    # The SDK sends its own anthropic-version (2023-06-01); the upstream gets the provider's.
    await gw.anthropic().messages.create(model="m", max_tokens=10, messages=MESSAGES)
    [seen] = prism_fake.requests("ok")
    assert seen.headers["anthropic-version"] == "2099-12-31"
    assert "anthropic-beta" not in seen.headers


async def test_unset_key_variable_warns_and_sends_no_key(
    prism_fake, prism_gateway, monkeypatch, caplog
):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with caplog.at_level(logging.WARNING):
        gw = await prism_gateway(
            catalog({"base_url": prism_fake.base_url("ok"), "api_key_env": "NOT_SET_ANYWHERE"}),
            load_plugins=PLUGINS,
        )
    assert (
        "providers.p.api_key_env: environment variable NOT_SET_ANYWHERE is not set" in caplog.text
    )
    message = await gw.anthropic(api_key="caller-key").messages.create(
        model="m", max_tokens=10, messages=MESSAGES
    )
    assert message.content[0].text
    [seen] = prism_fake.requests("ok")
    assert "x-api-key" not in seen.headers
    assert "Authorization" not in seen.headers


async def test_the_key_never_reaches_logs_or_error_bodies(
    prism_fake, prism_gateway, monkeypatch, caplog
):
    import anthropic

    monkeypatch.setenv("SECRET_KEY_VAR", "sk-ant-never-show-me")
    gw = await prism_gateway(
        catalog({"base_url": prism_fake.base_url("err401"), "api_key_env": "SECRET_KEY_VAR"}),
        load_plugins=PLUGINS,
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(anthropic.APIStatusError) as info:
        await gw.anthropic().messages.create(model="m", max_tokens=10, messages=MESSAGES)
    assert info.value.status_code == 503
    assert info.value.body["error"]["code"] == "upstream_auth_failed"
    assert prism_fake.requests("err401")[0].headers["x-api-key"] == "sk-ant-never-show-me"
    assert "sk-ant-never-show-me" not in info.value.response.text
    assert "sk-ant-never-show-me" not in caplog.text


@pytest.mark.parametrize(
    ("options", "default"), [({}, 4096), ({"default_max_tokens": 123}, 123)], ids=["4096", "123"]
)
async def test_default_max_tokens_fills_a_translated_request(
    prism_fake, prism_gateway, options, default
):
    gw = await prism_gateway(
        catalog({"base_url": prism_fake.base_url("ok"), **options}), load_plugins=PLUGINS
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.parse().choices[0].message.content.startswith("Hello from claude-up")
    assert raw.headers["x-prism-params-adjusted"] == f"max_tokens defaulted to {default}"
    # A request that sets max_tokens keeps it, and nothing is said.
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=50
    )
    assert "x-prism-params-adjusted" not in raw.headers
    defaulted, kept = prism_fake.requests("ok")
    assert defaulted.body["max_tokens"] == default
    assert kept.body["max_tokens"] == 50


@pytest.mark.parametrize(
    ("options", "key", "problem"),
    [
        ({"default_max_tokens": 0}, "default_max_tokens", "positive whole number"),
        ({"default_max_tokens": -5}, "default_max_tokens", "positive whole number"),
        ({"default_max_tokens": "4096"}, "default_max_tokens", "positive whole number"),
        ({"default_max_tokens": 1.5}, "default_max_tokens", "positive whole number"),
        ({"default_max_tokens": True}, "default_max_tokens", "positive whole number"),
        ({"base_url": "api.anthropic.com/v1"}, "base_url", "expected an http(s) URL"),
        ({"base_url": 42}, "base_url", "expected an http(s) URL"),
        ({"anthropic_version": ""}, "anthropic_version", "expected a version string"),
        ({"anthropic_version": 20230601}, "anthropic_version", "expected a version string"),
        ({"beta": "prompt-caching-2024-07-31"}, "beta", "list of beta feature names"),
        ({"beta": [1]}, "beta", "list of beta feature names"),
        ({"headers": {"x-team": 1}}, "headers", "table of string values"),
        ({"api_key_env": ""}, "api_key_env", "name of an environment variable"),
        ({"max_connections": 0}, "max_connections", "positive whole number"),
        ({"connect_timeout_ms": -1}, "connect_timeout_ms", "positive whole number"),
        ({"api_key": "sk-ant-inline"}, "api_key", "unknown option for kind 'anthropic'"),
        ({"deployments": True}, "deployments", "unknown option for kind 'anthropic'"),
    ],
)
async def test_option_errors_stop_start_up_naming_the_key(prism_gateway, options, key, problem):
    with pytest.raises(ConfigError) as info:
        await prism_gateway(catalog(options), load_plugins=PLUGINS)
    assert info.value.key == f"providers.p.{key}"
    assert problem in info.value.problem
    assert f"providers.p.{key}" in str(info.value)
    assert "sk-ant-inline" not in str(info.value)  # an inline key is refused, never echoed
