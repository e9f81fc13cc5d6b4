"""Translating answers between the OpenAI chat and Anthropic Messages formats.

Whole bodies are translated once; streams event by event with a small
stateful translator, so a translated stream is still relayed as it arrives.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import orjson

from ..call import Usage
from .anthropic import sse
from .events import ChunkKind
from .openai import tool_use_to_call

__all__ = [
    "AnthropicToOpenAIStream",
    "OpenAIToAnthropicStream",
    "StreamTranslator",
    "anthropic_to_openai_body",
    "openai_to_anthropic_body",
]

_TO_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_TO_OPENAI_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


class StreamTranslator(Protocol):
    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        """Client-format events for one upstream event."""

    def finish(self, usage: Usage | None) -> list[bytes]:
        """Client-format events due when the upstream stream ended well (before the final one)."""


def _anthropic_usage(usage: Usage | None) -> dict[str, int]:
    usage = usage or Usage()
    return {
        "input_tokens": usage.input_tokens
        - usage.cached_input_tokens
        - usage.cache_creation_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_creation_tokens,
        "cache_read_input_tokens": usage.cached_input_tokens,
    }


def _openai_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
    }


def _arguments(text: str | None) -> Any:
    try:
        return orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        # The model produced broken JSON; pass it on visibly rather than lose it.
        return {"_unparsed_arguments": text}


def openai_to_anthropic_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    choice = (payload.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    if message.get("refusal"):
        content.append({"type": "text", "text": message["refusal"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": _arguments(function.get("arguments")),
            }
        )
    return {
        "id": "msg_" + str(payload.get("id", "")).removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": payload.get("model"),
        "content": content,
        "stop_reason": _TO_ANTHROPIC_STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": _anthropic_usage(usage),
    }


def anthropic_to_openai_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    texts, calls = [], []
    for block in payload.get("content") or ():
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append(tool_use_to_call(block))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + str(payload.get("id", "")).removeprefix("msg_"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": payload.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _TO_OPENAI_FINISH.get(payload.get("stop_reason") or "", "stop"),
            }
        ],
        "usage": _openai_usage(usage or Usage()),
    }


class OpenAIToAnthropicStream:
    """OpenAI chunks in, Anthropic stream events out."""

    def __init__(self) -> None:
        self.started = False
        self.open_index: int | None = None
        self.next_index = 0
        self.tool_blocks: dict[int, int] = {}
        self.stop_reason = "end_turn"

    def _start(self, payload: Any) -> list[bytes]:
        self.started = True
        message = {
            "id": "msg_" + str(payload.get("id", "")).removeprefix("chatcmpl-"),
            "type": "message",
            "role": "assistant",
            "model": payload.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [sse({"type": "message_start", "message": message})]

    def _close(self) -> list[bytes]:
        if self.open_index is None:
            return []
        index, self.open_index = self.open_index, None
        return [sse({"type": "content_block_stop", "index": index})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open_index = self.next_index
        self.next_index += 1
        out.append(
            sse({"type": "content_block_start", "index": self.open_index, "content_block": block})
        )
        return out

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if kind is ChunkKind.USAGE or not isinstance(payload, dict):
            return []
        out = [] if self.started else self._start(payload)
        for choice in payload.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("refusal")
            if text:
                if self.open_index is None or self.open_index in self.tool_blocks.values():
                    out += self._open({"type": "text", "text": ""})
                out.append(
                    sse(
                        {
                            "type": "content_block_delta",
                            "index": self.open_index,
                            "delta": {"type": "text_delta", "text": text},
                        }
                    )
                )
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                position = call.get("index", 0)
                if position not in self.tool_blocks:
                    out += self._open(
                        {
                            "type": "tool_use",
                            "id": call.get("id"),
                            "name": function.get("name"),
                            "input": {},
                        }
                    )
                    assert self.open_index is not None
                    self.tool_blocks[position] = self.open_index
                if function.get("arguments"):
                    out.append(
                        sse(
                            {
                                "type": "content_block_delta",
                                "index": self.tool_blocks[position],
                                "delta": {
                                    "type": "input_json_delta",
                                    "partial_json": function["arguments"],
                                },
                            }
                        )
                    )
            reason = choice.get("finish_reason")
            if reason:
                out += self._close()
                self.stop_reason = _TO_ANTHROPIC_STOP.get(reason, "end_turn")
        return out

    def finish(self, usage: Usage | None) -> list[bytes]:
        out = [] if self.started else self._start({})
        out += self._close()
        out.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
                    "usage": _anthropic_usage(usage),
                }
            )
        )
        return out


class AnthropicToOpenAIStream:
    """Anthropic stream events in, OpenAI chunks out."""

    def __init__(self, *, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.head: dict[str, Any] = {
            "id": "chatcmpl-prism",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": None,
        }
        self.tools: dict[int, int] = {}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        chunk = {
            **self.head,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if not isinstance(payload, dict):
            return []
        kind_name = payload.get("type")
        if kind_name == "message_start":
            message = payload.get("message") or {}
            self.head["id"] = "chatcmpl-" + str(message.get("id", "")).removeprefix("msg_")
            self.head["model"] = message.get("model")
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind_name == "content_block_start":
            block = payload.get("content_block") or {}
            if block.get("type") == "tool_use":
                position = len(self.tools)
                self.tools[payload.get("index", 0)] = position
                return [
                    self._chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": position,
                                    "id": block.get("id"),
                                    "type": "function",
                                    "function": {"name": block.get("name"), "arguments": ""},
                                }
                            ]
                        }
                    )
                ]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind_name == "content_block_delta":
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [self._chunk({"content": delta["text"]})]
            if delta.get("type") == "input_json_delta" and delta.get("partial_json"):
                position = self.tools.get(payload.get("index", 0), 0)
                return [
                    self._chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": position,
                                    "function": {"arguments": delta["partial_json"]},
                                }
                            ]
                        }
                    )
                ]
            return []
        if kind_name == "message_delta":
            reason = (payload.get("delta") or {}).get("stop_reason")
            return [self._chunk({}, _TO_OPENAI_FINISH.get(reason or "", "stop"))]
        return []

    def finish(self, usage: Usage | None) -> list[bytes]:
        if not self.include_usage or usage is None:
            return []
        chunk = {**self.head, "choices": [], "usage": _openai_usage(usage)}
        return [b"data: " + orjson.dumps(chunk) + b"\n\n"]
