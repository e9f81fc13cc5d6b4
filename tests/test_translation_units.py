"""Translation between the OpenAI and Anthropic formats, piece by piece."""

from __future__ import annotations

import orjson
import pytest

from prism_proxy.call import Usage
from prism_proxy.wire.events import ChunkKind
from prism_proxy.wire.translate_request import (
    Untranslatable,
    anthropic_to_openai,
    openai_to_anthropic,
)
from prism_proxy.wire.translate_response import (
    AnthropicToOpenAIStream,
    OpenAIToAnthropicStream,
    anthropic_to_openai_body,
    openai_to_anthropic_body,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_openai_request_to_anthropic():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "No emojis."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "Thanks"},
        ],
        "max_completion_tokens": 100,
        "temperature": 0.5,
        "stop": "END",
        "tools": [TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "user": "u-42",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out, adjusted = openai_to_anthropic(body, 4096)
    assert out["system"] == "Be brief.\n\nNo emojis."
    assert out["max_tokens"] == 100
    assert out["stop_sequences"] == ["END"]
    assert out["metadata"] == {"user_id": "u-42"}
    assert out["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert out["tools"] == [
        {
            "name": "get_weather",
            "input_schema": TOOL["function"]["parameters"],
            "description": "Weather for a city",
        }
    ]
    user, assistant, tool_turn = out["messages"]
    assert user["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
    }
    assert user["content"][2]["source"] == {"type": "url", "url": "https://example.com/cat.jpg"}
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
        ],
    }
    # The tool result and the next user text share one user turn.
    assert tool_turn["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
        {"type": "text", "text": "Thanks"},
    ]
    assert adjusted == []


def test_parameters_the_translation_does_not_know_are_reported():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 5,
        "store": True,
        "verbosity": "low",
        "prompt_cache_key": "k",
    }
    _, adjusted = openai_to_anthropic(body, 1)
    assert adjusted == ["dropped store", "dropped verbosity", "dropped prompt_cache_key"]
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 5,
        "service_tier": "auto",
        "context_management": {},
    }
    _, adjusted = anthropic_to_openai(body)
    assert adjusted == ["dropped service_tier", "dropped context_management"]


def test_missing_max_tokens_gets_the_providers_default_and_says_so():
    out, adjusted = openai_to_anthropic(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, 777
    )
    assert out["max_tokens"] == 777
    assert adjusted == ["max_tokens defaulted to 777"]


@pytest.mark.parametrize(
    ("extra", "feature"),
    [
        ({"n": 2}, "n > 1"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_schema"}}, "response_format json_schema"),
        ({"temperature": 1.5}, "temperature above 1"),
        ({"seed": 7}, "seed"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
    ],
)
def test_openai_features_anthropic_lacks(extra, feature):
    with pytest.raises(Untranslatable, match=feature):
        openai_to_anthropic(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}, 1
        )


def test_anthropic_request_to_openai():
    body = {
        "model": "m",
        "max_tokens": 50,
        "system": [{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAA"},
                    },
                    {"type": "text", "text": "Weather?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "snow"}],
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "stop_sequences": ["x"],
        "metadata": {"user_id": "u1"},
    }
    out, adjusted = anthropic_to_openai(body)
    assert out["messages"][0] == {"role": "system", "content": "Be kind."}
    assert out["messages"][1]["content"][0] == {
        "type": "image_url",
        "image_url": {"url": "data:image/jpeg;base64,AAA"},
    }
    assert out["messages"][2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Oslo"}',
    }
    assert out["messages"][2]["content"] == "Let me check."
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "snow"}
    assert out["messages"][4]["content"] == [{"type": "text", "text": "And tomorrow?"}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert out["parallel_tool_calls"] is False
    assert out["stop"] == ["x"] and out["user"] == "u1" and out["max_tokens"] == 50
    assert adjusted == ["dropped cache_control"]


@pytest.mark.parametrize(
    ("extra", "feature"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "extended thinking"),
        ({"top_k": 5}, "top_k"),
        ({"stop_sequences": list("abcde")}, "more than 4 stop sequences"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ],
)
def test_anthropic_features_openai_lacks(extra, feature):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(Untranslatable, match=feature):
        anthropic_to_openai(body)


def test_document_blocks_cannot_go_to_openai():
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "base64", "media_type": "application/pdf", "data": "x"},
                    }
                ],
            }
        ],
    }
    with pytest.raises(Untranslatable, match="document"):
        anthropic_to_openai(body)


def test_whole_answers_both_ways():
    openai_answer = {
        "id": "chatcmpl-abc",
        "model": "gpt",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        }
                    ],
                },
            }
        ],
    }
    usage = Usage(input_tokens=10, output_tokens=5, cached_input_tokens=4)
    message = openai_to_anthropic_body(openai_answer, usage)
    assert message["id"] == "msg_abc"
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_9", "name": "f", "input": {"a": 1}},
    ]
    assert message["usage"]["input_tokens"] == 6
    assert message["usage"]["cache_read_input_tokens"] == 4

    back = anthropic_to_openai_body(message, usage)
    assert back["choices"][0]["finish_reason"] == "tool_calls"
    assert back["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    assert back["usage"]["prompt_tokens"] == 10
    assert back["usage"]["prompt_tokens_details"]["cached_tokens"] == 4


def _events(raw: list[bytes]) -> list[dict]:
    return [orjson.loads(e.split(b"data: ", 1)[1]) for e in raw]


def test_openai_stream_to_anthropic_events():
    translator = OpenAIToAnthropicStream()
    head = {"id": "chatcmpl-1", "model": "gpt"}
    out = []
    out += translator.convert(
        ChunkKind.PRELUDE, {**head, "choices": [{"delta": {"role": "assistant", "content": ""}}]}
    )
    out += translator.convert(
        ChunkKind.CONTENT, {**head, "choices": [{"delta": {"content": "Hi"}}]}
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {
            **head,
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "f", "arguments": ""},
                            }
                        ]
                    }
                }
            ],
        },
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {
            **head,
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}}
            ],
        },
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {
            **head,
            "choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}],
        },
    )
    out += translator.convert(
        ChunkKind.CONTENT, {**head, "choices": [{"delta": {}, "finish_reason": "tool_calls"}]}
    )
    out += translator.convert(
        ChunkKind.USAGE, {**head, "choices": [], "usage": {"prompt_tokens": 3}}
    )
    out += translator.finish(Usage(input_tokens=3, output_tokens=7))
    events = _events(out)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
    ]
    assert events[4]["content_block"] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "f",
        "input": {},
    }
    assert events[5]["index"] == 1 and events[5]["delta"]["partial_json"] == '{"a":'
    assert events[8]["delta"]["stop_reason"] == "tool_use"
    assert events[8]["usage"]["output_tokens"] == 7


def test_anthropic_stream_to_openai_chunks():
    translator = AnthropicToOpenAIStream(include_usage=True)
    out = []
    out += translator.convert(
        ChunkKind.PRELUDE, {"type": "message_start", "message": {"id": "msg_1", "model": "claude"}}
    )
    out += translator.convert(
        ChunkKind.PRELUDE,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hey"}},
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        },
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"a":1}'},
        },
    )
    out += translator.convert(
        ChunkKind.CONTENT,
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 4},
        },
    )
    out += translator.finish(Usage(input_tokens=2, output_tokens=4))
    chunks = _events(out)
    assert chunks[0]["id"] == "chatcmpl-1"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hey"}
    assert chunks[2]["choices"][0]["delta"]["tool_calls"][0]["id"] == "toolu_1"
    assert chunks[3]["choices"][0]["delta"]["tool_calls"][0] == {
        "index": 0,
        "function": {"arguments": '{"a":1}'},
    }
    assert chunks[4]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["total_tokens"] == 6
