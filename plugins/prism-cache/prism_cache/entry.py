"""A cached answer, kept apart from any wire: read from what a caller got, written for the next.

An entry holds the answer's text, its usage and the line that made it: so a
non-streaming caller's answer can be replayed to a streaming one (and to any
caller wire: chat, messages, responses).  Only answers that are text, or
(chat and messages) text and tool calls, ended naturally (``stop``,
``end_turn``, ``tool_calls``/``tool_use``, a completed response), are kept:
reasoning, refusals, Responses function calls and answers cut at
``max_tokens`` are not.  A replayed tool call gets an id of its own.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import orjson

from prism_proxy import Endpoint, Usage, wire_for

__all__ = ["Entry", "Read", "read_answer", "render"]

_CHAT, _MESSAGES, _RESPONSES = Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.RESPONSES
#: A tool call: its name and its arguments as JSON text.
ToolCall = tuple[str, str]


@attrs.frozen
class Read:
    """What an answer said: its text, the model it named, the tools it called."""

    text: str
    model: str
    calls: tuple[ToolCall, ...] = ()


@attrs.frozen
class Entry:
    text: str
    #: The model the answer named (``model`` in its body).
    model: str
    #: The served line: its index in the model's chain (same fingerprint, same chain).
    line: int
    input_tokens: int
    output_tokens: int
    #: When it was stored (the store's clock, seconds).
    stored_at: float
    calls: tuple[ToolCall, ...] = ()

    def dumps(self) -> bytes:
        # orjson hands back its 4 KiB write buffer as the bytes object: a blob
        # kept for minutes would hold 4 KiB however short the answer, and the
        # store's byte bound (which counts len()) would not bound memory.
        # The copy is exactly as long as the blob.
        return memoryview(self._dumps()).tobytes()

    def _dumps(self) -> bytes:
        return orjson.dumps(
            {
                "text": self.text,
                "model": self.model,
                "line": self.line,
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "stored_at": self.stored_at,
                "calls": self.calls,
            }
        )

    @classmethod
    def loads(cls, blob: bytes) -> Entry | None:
        try:
            data = orjson.loads(blob)
            return cls(
                text=str(data["text"]),
                model=str(data["model"]),
                line=int(data["line"]),
                input_tokens=int(data["input_tokens"]),
                output_tokens=int(data["output_tokens"]),
                stored_at=float(data["stored_at"]),
                calls=tuple((str(name), str(args)) for name, args in data.get("calls") or ()),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # written by another version, or damaged: a miss

    @property
    def usage(self) -> Usage:
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens)


def read_answer(endpoint: Endpoint, stream: bool, answer: bytes) -> Read | None:
    """What an answer as its caller got it said, or None when it is not one that
    is kept (see the module's docstring)."""
    try:
        if not stream:
            body = orjson.loads(answer)
            if endpoint is _CHAT:
                return _chat_body(body)
            if endpoint is _MESSAGES:
                return _messages_body(body)
            return _responses_body(body)
        events = list(_events(answer))
        if endpoint is _CHAT:
            return _chat_events(events)
        if endpoint is _MESSAGES:
            return _messages_events(events)
        for event in reversed(events):
            if event.get("type") == "response.completed":
                return _responses_body(event.get("response"))
        return None
    except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError, IndexError):
        return None


def _events(stream: bytes) -> Any:
    for block in stream.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data and data != b"[DONE]":
                    yield orjson.loads(data)


def _chat_body(body: Any) -> Read | None:
    choices = body["choices"]
    if len(choices) != 1:
        return None
    choice = choices[0]
    message = choice["message"]
    text = message.get("content") or ""
    if message.get("function_call") or message.get("refusal") or not isinstance(text, str):
        return None
    calls = tuple(
        (str(call["function"]["name"]), str(call["function"]["arguments"]))
        for call in message.get("tool_calls") or ()
    )
    return _natural(text, str(body.get("model") or ""), calls, choice.get("finish_reason"))


def _natural(text: str, model: str, calls: tuple[ToolCall, ...], finish: Any) -> Read | None:
    """The answer, if it ended as it meant to: text that stopped, or tool calls."""
    if calls and finish in ("tool_calls", "tool_use"):
        return Read(text, model, calls)
    if not calls and text and finish in ("stop", "end_turn"):
        return Read(text, model)
    return None


def _chat_events(events: list[Any]) -> Read | None:
    parts: list[str] = []
    calls: dict[int, list[str]] = {}
    finish = None
    model = ""
    for event in events:
        model = str(event.get("model") or model)
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                return None
            delta = choice.get("delta") or {}
            if delta.get("function_call") or delta.get("refusal"):
                return None
            if isinstance(delta.get("content"), str):
                parts.append(delta["content"])
            for piece in delta.get("tool_calls") or ():
                call = calls.setdefault(int(piece["index"]), ["", ""])
                function = piece.get("function") or {}
                call[0] += function.get("name") or ""
                call[1] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    made = tuple((name, args) for _, (name, args) in sorted(calls.items()))
    return _natural("".join(parts), model, made, finish)


def _messages_body(body: Any) -> Read | None:
    parts: list[str] = []
    calls: list[ToolCall] = []
    for block in body["content"]:
        kind = block.get("type")
        if kind == "text":
            parts.append(block["text"])
        elif kind == "tool_use":
            calls.append((str(block["name"]), orjson.dumps(block["input"]).decode()))
        else:
            return None
    model = str(body.get("model") or "")
    return _natural("".join(parts), model, tuple(calls), body.get("stop_reason"))


def _messages_events(events: list[Any]) -> Read | None:
    parts: list[str] = []
    calls: dict[int, list[str]] = {}
    stop = None
    model = ""
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            model = str(event["message"].get("model") or "")
        elif kind == "content_block_start":
            block = event["content_block"]
            if block.get("type") == "tool_use":
                calls[int(event["index"])] = [str(block["name"]), ""]
            elif block.get("type") != "text":
                return None
        elif kind == "content_block_delta":
            delta = event["delta"]
            if delta.get("type") == "text_delta":
                parts.append(delta["text"])
            elif delta.get("type") == "input_json_delta":
                calls[int(event["index"])][1] += delta["partial_json"]
            else:
                return None
        elif kind == "message_delta":
            stop = event["delta"].get("stop_reason") or stop
    made = tuple(
        (name, orjson.dumps(orjson.loads(args or "{}")).decode())
        for _, (name, args) in sorted(calls.items())
    )
    return _natural("".join(parts), model, made, stop)


def _responses_body(body: Any) -> Read | None:
    if body.get("status") != "completed":
        return None
    parts: list[str] = []
    for item in body["output"]:
        if item.get("type") != "message":
            return None
        for part in item["content"]:
            if part.get("type") != "output_text":
                return None
            parts.append(part["text"])
    text = "".join(parts)
    return Read(text, str(body.get("model") or "")) if text else None


def render(
    endpoint: Endpoint,
    stream: bool,
    entry: Entry,
    suffix: str,
    include_usage: bool,
    request: dict[str, Any],
) -> tuple[bytes, bytes]:
    """The entry in the caller's wire: ``(body, tail)``; a stream's final event is the core's."""
    if endpoint is _CHAT:
        return _chat_stream(entry, suffix, include_usage) if stream else _chat_whole(entry, suffix)
    if endpoint is _MESSAGES:
        return _messages_stream(entry, suffix) if stream else _messages_whole(entry, suffix)
    return _responses(
        stream,
        suffix,
        entry.model,
        entry.text,
        entry.input_tokens,
        entry.output_tokens,
        request,
    )


def _chat_calls(entry: Entry, suffix: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{suffix}_{index}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        for index, (name, arguments) in enumerate(entry.calls)
    ]


def _chat_whole(entry: Entry, suffix: str) -> tuple[bytes, bytes]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": entry.text or None,
        "refusal": None,
    }
    if entry.calls:
        message["tool_calls"] = _chat_calls(entry, suffix)
    body = {
        "id": "chatcmpl-" + suffix,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": entry.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if entry.calls else "stop",
            }
        ],
        "usage": _chat_usage(entry),
    }
    return orjson.dumps(body), b""


def _chat_usage(entry: Entry) -> dict[str, int]:
    inputs, outputs = entry.input_tokens, entry.output_tokens
    return {"prompt_tokens": inputs, "completion_tokens": outputs, "total_tokens": inputs + outputs}


def _chat_stream(entry: Entry, suffix: str, include_usage: bool) -> tuple[bytes, bytes]:
    head: dict[str, Any] = {
        "id": "chatcmpl-" + suffix,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": entry.model,
    }
    if include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks.extend(chunk({"content": piece}) for piece in _pieces(entry.text))
    for index, call in enumerate(_chat_calls(entry, suffix)):
        arguments = call["function"]["arguments"]
        first = {**call, "index": index, "function": {"name": call["function"]["name"]}}
        first["function"]["arguments"] = ""
        chunks.append(chunk({"tool_calls": [first]}))
        chunks.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(arguments)
        )
    chunks.append(chunk({}, "tool_calls" if entry.calls else "stop"))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": _chat_usage(entry)})
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks), b""


def _pieces(text: str, size: int = 64) -> list[str]:
    """The text in pieces, as a stream delivers it (a reader sees it arrive in parts)."""
    return [text[start : start + size] for start in range(0, len(text), size)]


def _messages_blocks(entry: Entry, suffix: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": entry.text}] if entry.text else []
    for index, (name, arguments) in enumerate(entry.calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{suffix}_{index}",
                "name": name,
                "input": orjson.loads(arguments),
            }
        )
    return blocks


def _messages_whole(entry: Entry, suffix: str) -> tuple[bytes, bytes]:
    body = {
        "id": "msg_" + suffix,
        "type": "message",
        "role": "assistant",
        "model": entry.model,
        "content": _messages_blocks(entry, suffix),
        "stop_reason": "tool_use" if entry.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": entry.input_tokens, "output_tokens": entry.output_tokens},
    }
    return orjson.dumps(body), b""


def _messages_stream(entry: Entry, suffix: str) -> tuple[bytes, bytes]:
    message: dict[str, Any] = {
        "id": "msg_" + suffix,
        "type": "message",
        "role": "assistant",
        "model": entry.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": entry.input_tokens, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(_messages_blocks(entry, suffix)):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            start = {**block, "input": {}}
            arguments = orjson.dumps(block["input"]).decode()
            deltas = [
                {"type": "input_json_delta", "partial_json": piece} for piece in _pieces(arguments)
            ]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events.extend(
            {"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas
        )
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": "tool_use" if entry.calls else "end_turn",
                "stop_sequence": None,
            },
            "usage": {"output_tokens": entry.output_tokens},
        }
    )
    body = b"".join(
        b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
        for event in events
    )
    return body, b""


def _responses(
    stream: bool,
    suffix: str,
    model: str,
    text: str,
    inputs: int,
    outputs: int,
    request: dict[str, Any],
) -> tuple[bytes, bytes]:
    """Responses' shapes are the core's own (its degraded answer), with the usage put in
    and the request's parameters repeated, as every Response the gateway writes."""
    wire = wire_for(_RESPONSES)
    echo = wire.echo(request) if wire.echo is not None else {}
    usage = {
        "input_tokens": inputs,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": outputs,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inputs + outputs,
    }
    if not stream:
        body = {**wire.degraded_body(suffix, model, text), **echo, "usage": usage}
        return orjson.dumps(body), b""
    blocks = [block for block in wire.degraded_events(suffix, model, text).split(b"\n\n") if block]
    out: list[bytes] = []
    for block in blocks:
        name, _, data = block.partition(b"\ndata: ")
        event = orjson.loads(data)
        response = event.get("response")
        if isinstance(response, dict):
            response.update(echo)
            if event.get("type") == "response.completed":
                response["usage"] = usage
            block = name + b"\ndata: " + orjson.dumps(event)
        out.append(block + b"\n\n")
    # The completed event goes last, after the call is settled, as a served stream's does.
    return b"".join(out[:-1]), out[-1] if out else b""
