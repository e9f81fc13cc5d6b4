"""The compatibility gate: a line that cannot take a request is skipped before dispatch."""

from __future__ import annotations

import openai
import pytest

from prism_proxy import ConfigError, config_from_mapping, create_app

HI = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
    }
]


def catalog(fake, first: dict, second: dict | None = None) -> dict:
    lines = [{"provider": "a", "model": "up-a", **first}]
    if second is not None:
        lines.append({"provider": "b", "model": "up-b", **second})
    return {
        "providers": {
            "a": {"kind": "openai", "base_url": fake.base_url("a")},
            "b": {"kind": "openai", "base_url": fake.base_url("b")},
        },
        "models": {"m": {"chain": lines}},
    }


async def chat(gw, **kwargs):
    return await gw.openai().chat.completions.with_raw_response.create(model="m", **kwargs)


@pytest.mark.parametrize(
    ("capability", "request_args"),
    [
        ("tools", {"messages": HI, "tools": TOOLS}),
        (
            "vision",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this"},
                            {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
                        ],
                    }
                ]
            },
        ),
        ("json_mode", {"messages": HI, "response_format": {"type": "json_object"}}),
        (
            "audio",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_audio",
                                "input_audio": {"data": "AA==", "format": "wav"},
                            }
                        ],
                    }
                ]
            },
        ),
    ],
)
async def test_a_request_skips_lines_that_lack_its_capability(
    prism_fake, prism_gateway, capability, request_args
):
    gw = await prism_gateway(
        catalog(prism_fake, {"capabilities": []}, {"capabilities": [capability]}),
        load_plugins=["openai"],
    )
    raw = await chat(gw, **request_args)
    assert raw.headers["x-prism-provider"] == "b"
    assert raw.headers["x-prism-attempt-log"].startswith(f"a/up-a skipped lacks {capability}; ")
    assert prism_fake.hits("a") == 0
    # A request that needs nothing is served by the first line as usual.
    plain = await chat(gw, messages=HI)
    assert plain.headers["x-prism-provider"] == "a"


async def test_a_line_that_declares_nothing_is_not_gated(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, {}, {"capabilities": ["tools"]}))
    raw = await chat(gw, messages=HI, tools=TOOLS)
    assert raw.headers["x-prism-provider"] == "a"


async def test_a_prompt_larger_than_a_lines_context_skips_it(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, {"max_context_tokens": 50}, {"max_context_tokens": 100_000}),
        load_plugins=["openai"],
    )
    long = [{"role": "user", "content": "word " * 100}]  # about 125 tokens
    raw = await chat(gw, messages=long)
    assert raw.headers["x-prism-provider"] == "b"
    assert (
        "a/up-a skipped prompt ~125 tokens > max_context_tokens 50"
        in (raw.headers["x-prism-attempt-log"])
    )
    assert (await chat(gw, messages=HI)).headers["x-prism-provider"] == "a"


async def test_nothing_compatible_is_a_400_with_the_reasons(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, {"capabilities": ["vision"]}, {"max_context_tokens": 10}),
        load_plugins=["openai"],
    )
    with pytest.raises(openai.BadRequestError) as info:
        await chat(gw, messages=[{"role": "user", "content": "word " * 40}], tools=TOOLS)
    assert info.value.code == "no_compatible_binding"
    assert "a/up-a: lacks tools" in info.value.message
    assert "b/up-b: prompt ~50 tokens > max_context_tokens 10" in info.value.message
    assert prism_fake.hits("a") == prism_fake.hits("b") == 0


async def test_anthropic_callers_are_gated_alike(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, {"capabilities": ["vision"]}, {"capabilities": ["tools", "vision"]}),
        load_plugins=["openai"],
    )
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sun"}],
        },
    ]
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=50, messages=messages
    )
    assert raw.headers["x-prism-provider"] == "b"


@pytest.mark.parametrize(
    ("line", "key", "problem"),
    [
        ({"capabilities": ["telepathy"]}, "capabilities", "expected a list of tools"),
        ({"capabilities": "tools"}, "capabilities", "expected a list of tools"),
        ({"max_context_tokens": 0}, "max_context_tokens", "whole number >= 1"),
        ({"max_context_tokens": "8k"}, "max_context_tokens", "whole number >= 1"),
    ],
)
def test_bad_gate_settings_stop_start_up(prism_fake, line, key, problem):
    with pytest.raises(ConfigError) as info:
        create_app(config_from_mapping({}, catalog_data=catalog(prism_fake, line)))
    assert info.value.key == f"models.m.chain[0].{key}"
    assert problem in info.value.problem
