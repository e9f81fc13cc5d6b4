"""Translating answers between the OpenAI chat and Anthropic Messages formats.

Whole bodies are translated once; streams event by event with a small
stateful translator, so a translated stream is still relayed as it arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jsonschema
import orjson

from ..call import Usage
from ..errors import PrismError
from ..sse import SSEBuffer, event_data
from .anthropic import sse
from .chat_parts import ChatChunks, chat_completion, chat_tool_call
from .events import ChunkKind
from .translate_request import ANSWER_TOOL

__all__ = [
    "AnthropicToOpenAIStream",
    "OpenAIToAnthropicStream",
    "StreamTranslator",
    "StreamTranslatorBase",
    "anthropic_to_openai_body",
    "answer_schema",
    "openai_to_anthropic_body",
    "structured_events",
    "structured_message",
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
    """Turns one upstream stream into the caller's wire, event by event.

    A translator subclasses :class:`StreamTranslatorBase` for the defaults of
    ``repeat`` and ``failed``, which the relay calls once per stream at most.
    """

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        """Client-format events for one upstream event."""

    def finish(self, usage: Usage | None) -> list[bytes]:
        """Client-format events due when the upstream stream ended well (before the final one)."""

    def repeat(self, echo: Mapping[str, Any]) -> None:
        """Take the request's parameters the caller's wire repeats in answers (``Wire.echo``)."""

    def failed(self, err: PrismError) -> bytes | None:
        """The end of a stream that broke after its commit point (None: the wire's error event)."""


class StreamTranslatorBase:
    """The defaults of :class:`StreamTranslator`: a wire with nothing to
    repeat, whose broken stream ends with the wire's own error event."""

    __slots__ = ()

    def repeat(self, echo: Mapping[str, Any]) -> None:
        return None

    def failed(self, err: PrismError) -> bytes | None:
        # Only a wire whose events are numbered (Responses) ends in sequence.
        return None


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
            calls.append(
                chat_tool_call(block.get("id"), block.get("name"), block.get("input") or {})
            )
    return chat_completion(
        completion_id="chatcmpl-" + str(payload.get("id", "")).removeprefix("msg_"),
        model=payload.get("model"),
        texts=texts,
        tool_calls=calls,
        finish_reason=_TO_OPENAI_FINISH.get(payload.get("stop_reason") or "", "stop"),
        usage=usage,
    )


class OpenAIToAnthropicStream(StreamTranslatorBase):
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


class AnthropicToOpenAIStream(StreamTranslatorBase):
    """Anthropic stream events in, OpenAI chunks out."""

    def __init__(self, *, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.chunks = ChatChunks("chatcmpl-prism")
        self.tools: dict[int, int] = {}

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if not isinstance(payload, dict):
            return []
        kind_name = payload.get("type")
        if kind_name == "message_start":
            message = payload.get("message") or {}
            message_id = str(message.get("id", ""))
            self.chunks.completion_id = "chatcmpl-" + message_id.removeprefix("msg_")
            self.chunks.model = message.get("model")
            return [self.chunks.delta({"role": "assistant", "content": ""})]
        if kind_name == "content_block_start":
            block = payload.get("content_block") or {}
            if block.get("type") == "tool_use":
                position = len(self.tools)
                self.tools[payload.get("index", 0)] = position
                return [
                    self.chunks.delta(
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
                return [self.chunks.delta({"content": block["text"]})]
            return []
        if kind_name == "content_block_delta":
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [self.chunks.delta({"content": delta["text"]})]
            if delta.get("type") == "input_json_delta" and delta.get("partial_json"):
                position = self.tools.get(payload.get("index", 0), 0)
                return [
                    self.chunks.delta(
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
            return [self.chunks.delta({}, _TO_OPENAI_FINISH.get(reason or "", "stop"))]
        return []

    def finish(self, usage: Usage | None) -> list[bytes]:
        if not self.include_usage or usage is None:
            return []
        return [self.chunks.usage(usage)]


# -- structured outputs on an Anthropic line ------------------------------------------
# ``response_format`` went upstream as the forced tool ANSWER_TOOL: its input
# is the answer.  The Anthropic answer is rewritten, before any translator
# sees it, into the message a line with structured outputs would have given
# (one text block: the JSON), and checked against the schema: an answer that
# is not JSON or does not match is a failed attempt, never served.


def answer_schema(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The schema of the answer tool in a translated Messages body, or None without one."""
    for tool in body.get("tools") or ():
        if tool.get("name") == ANSWER_TOOL:
            schema: dict[str, Any] = tool["input_schema"]
            return schema
    return None


def _mismatch(answer: Any, schema: dict[str, Any]) -> str | None:
    """Why ``answer`` does not match ``schema`` (a JSON path, never a value), or None."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(answer))
    if error is None:
        return None
    return f"structured answer does not match its schema at {error.json_path[:80]}"


def _answer_json(text: str) -> tuple[Any, str | None]:
    try:
        return orjson.loads(text or "{}"), None
    except orjson.JSONDecodeError:
        return None, "structured answer is not JSON"


_NO_ANSWER = "the answer has no structured output"


def structured_message(
    payload: dict[str, Any], schema: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """A whole Messages answer with the answer tool's input as its text; or why it cannot be."""
    content = payload.get("content") or []
    answer = next(
        (b for b in content if b.get("type") == "tool_use" and b.get("name") == ANSWER_TOOL), None
    )
    if answer is None:
        if any(block.get("type") == "tool_use" for block in content):
            return payload, None  # a call of the caller's own tools: passed on as it is
        return payload, _NO_ANSWER
    problem = _mismatch(answer.get("input"), schema)
    if problem is not None:
        return payload, problem
    text = orjson.dumps(answer.get("input")).decode()
    # Only the answer (and any reasoning) stays: the text is the JSON, nothing else.
    blocks = [b for b in content if b.get("type") in ("thinking", "redacted_thinking")]
    blocks.append({"type": "text", "text": text})
    stop = payload.get("stop_reason")
    return {
        **payload,
        "content": blocks,
        "stop_reason": "end_turn" if stop == "tool_use" else stop,
    }, None


def structured_events(raw: bytes, schema: dict[str, Any]) -> tuple[bytes, str | None]:
    """A whole Messages stream with the answer tool's input as text deltas; or why it cannot be.

    The stream must be complete (``message_stop``, no error event): a
    structured answer is served only once it is known to match.
    """
    buffer = SSEBuffer()
    buffer.feed(raw)
    events: list[dict[str, Any]] = []
    while (event := buffer.next_event()) is not None:
        data = event_data(event)
        if data is None:
            continue
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return raw, "upstream sent an event that is not JSON"
        if not isinstance(payload, dict):
            return raw, "upstream sent an event that is not an object"
        events.append(payload)
    kinds = [payload.get("type") for payload in events]
    if "error" in kinds or "message_stop" not in kinds:
        return raw, "the stream ended before its structured answer was complete"
    answer_index: int | None = None
    other_tool = False
    for payload in events:
        start = payload.get("type") == "content_block_start"
        block = payload.get("content_block") if start else None
        if isinstance(block, dict) and block.get("type") == "tool_use":
            if block.get("name") == ANSWER_TOOL:
                answer_index = payload.get("index")
            else:
                other_tool = True
    if answer_index is None:
        return raw, None if other_tool else _NO_ANSWER
    pieces: list[str] = []
    out: list[bytes] = []
    dropped: set[Any] = set()  # text beside the answer: the content is the JSON alone
    for payload in events:
        kind = payload.get("type")
        index = payload.get("index")
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            if index in dropped:
                continue
            if index != answer_index:
                block = payload.get("content_block") or {}
                if kind == "content_block_start" and block.get("type") == "text":
                    dropped.add(index)
                    continue
            elif kind == "content_block_start":
                payload = {**payload, "content_block": {"type": "text", "text": ""}}
            elif kind == "content_block_delta":
                text = (payload.get("delta") or {}).get("partial_json") or ""
                if not text:
                    continue
                pieces.append(text)
                payload = {**payload, "delta": {"type": "text_delta", "text": text}}
            elif not pieces:
                # An empty input streams no delta: the answer is still an object.
                pieces.append("{}")
                delta = {"type": "text_delta", "text": "{}"}
                out.append(sse({"type": "content_block_delta", "index": index, "delta": delta}))
        elif kind == "message_delta":
            delta = payload.get("delta") or {}
            if delta.get("stop_reason") == "tool_use":
                payload = {**payload, "delta": {**delta, "stop_reason": "end_turn"}}
        out.append(sse(payload))
    answer, problem = _answer_json("".join(pieces))
    if problem is None:
        problem = _mismatch(answer, schema)
    return (raw, problem) if problem is not None else (b"".join(out), None)
