"""The public chat helpers providers for other wires read requests and write answers with.

What the translations exercise end to end (through the gateway, for
Anthropic, Gemini and Bedrock lines) is not repeated here: only the edges.
"""

from __future__ import annotations

import orjson
import pytest

from prism_proxy import (
    OPENAI_ONLY_PARAMS,
    ChatChunks,
    DataURL,
    Untranslatable,
    Usage,
    chat_turns,
    check_chat_params,
    data_url,
    system_text,
    tool_arguments,
    tool_result_text,
)

HELLO = {"role": "user", "content": "hi"}


def _check(**params: object) -> list[str]:
    body = {"model": "m", "messages": [HELLO], **params}
    return check_chat_params(
        body,
        unsupported={**OPENAI_ONLY_PARAMS, "presence_penalty": "presence_penalty"},
        carried={"model", "messages", "temperature"},
    )


@pytest.mark.parametrize(
    "params",
    [
        {"n": 1},
        {"logprobs": False},
        {"modalities": ["text"]},
        {"presence_penalty": 0},
        {"audio": None},
    ],
)
def test_openai_defaults_are_not_refused(params):
    assert _check(**params) == []


@pytest.mark.parametrize(
    ("params", "feature"),
    [
        ({"n": 2}, "n > 1"),
        ({"modalities": ["text", "audio"]}, "audio output"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"top_logprobs": 0}, "logprobs"),
    ],
)
def test_what_changes_the_answer_is_refused_by_its_feature(params, feature):
    with pytest.raises(Untranslatable) as caught:
        _check(**params)
    assert str(caught.value) == feature


def test_parameters_neither_carried_nor_refused_are_listed_as_dropped():
    assert _check(temperature=0.2, user="u", store=True, seed=None, n=1) == [
        "dropped user",
        "dropped store",
    ]


def test_data_urls():
    assert data_url("data:IMAGE/PNG;base64,iVBOR") == DataURL("image/png", "iVBOR")
    assert data_url("data:;base64,AAAA") == DataURL("", "AAAA")
    assert data_url("https://x.test/a.png") is None
    with pytest.raises(Untranslatable, match=r"^an image by URL$"):
        data_url("https://x.test/a.png", remote="an image by URL")
    with pytest.raises(Untranslatable, match=r"^a file that is not a base64 data URL$"):
        data_url("data:text/plain,hello", "a file")


def test_system_text_joins_messages_and_refuses_images():
    body = {
        "messages": [
            {"role": "system", "content": "One."},
            HELLO,
            {"role": "developer", "content": [{"type": "text", "text": "Two"}] * 2},
        ]
    }
    assert system_text(body) == "One.\n\nTwo\nTwo"
    assert system_text({"messages": [HELLO]}) is None
    assert system_text({"messages": [{"role": "system", "content": ""}]}) == ""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    with pytest.raises(Untranslatable, match="system content part type 'image_url'"):
        system_text({"messages": [{"role": "system", "content": [image]}]})


def test_tool_arguments_and_results():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert tool_arguments(call) == {"a": 1}
    assert tool_arguments({"function": {"name": "f", "arguments": ""}}) == {}
    for arguments, reason in (("[1]", "not a JSON object"), ("{", "not JSON")):
        with pytest.raises(Untranslatable, match=reason):
            tool_arguments({"function": {"name": "f", "arguments": arguments}})
    assert tool_result_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == (
        "a\nb"
    )
    with pytest.raises(Untranslatable, match="tool result part type 'image_url'"):
        tool_result_text([{"type": "image_url"}])


def test_turns_of_one_role_merge_and_empty_ones_are_left_out():
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
            {"role": "tool", "tool_call_id": "t", "content": "d"},
        ]
    }

    def text(message):
        return [{"text": message["content"]}] if message["content"] else []

    turns = chat_turns(
        body, user=text, assistant=text, tool=text, assistant_role="model", key="parts"
    )
    assert turns == [
        {"role": "user", "parts": [{"text": "a"}, {"text": "b"}]},
        {"role": "model", "parts": [{"text": "c"}]},
        {"role": "user", "parts": [{"text": "d"}]},
    ]
    with pytest.raises(Untranslatable, match="message role 'function'"):
        chat_turns({"messages": [{"role": "function"}]}, user=text, assistant=text, tool=text)


def test_stream_chunks_carry_the_head_set_last():
    chunks = ChatChunks("chatcmpl-1", created=5)
    chunks.model = "up"
    event = chunks.delta({"content": "hi"}, "stop")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:]) == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "up",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
    }
    usage = orjson.loads(
        chunks.usage(Usage(input_tokens=3, output_tokens=4, reasoning_tokens=2))[6:]
    )
    assert usage["choices"] == []
    assert usage["usage"]["total_tokens"] == 7
    assert usage["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
