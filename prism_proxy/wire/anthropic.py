"""The Anthropic Messages wire format: validation, stream event inspection, usage, errors."""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from ..call import Endpoint, Usage, token_count
from ..errors import PrismError
from .chat_parts import estimated_usage, text_chars
from .events import ChunkKind
from .shape import ANTHROPIC_MEMBERS, anthropic_block, bad

__all__ = [
    "DONE_EVENT",
    "error_body",
    "error_event",
    "event_kind",
    "message_body",
    "message_events",
    "digest",
    "usage_update",
    "validate_messages",
]

DONE_EVENT = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


#: The content block types a Messages request may carry; the upstream rejects
#: anything else, but only after the call was dispatched (and billed).
BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "thinking",
        "redacted_thinking",
    }
)


def validate_messages(body: dict[str, Any]) -> tuple[str, bool]:
    """Check a Messages API request; returns (model, stream)."""
    model = body.get("model")
    if "model" not in body:
        raise bad("missing_field", "'model' is required", "model")
    if not isinstance(model, str) or not model:
        raise bad("invalid_type", "'model' must be a non-empty string", "model")
    if "max_tokens" not in body:
        raise bad("missing_field", "'max_tokens' is required", "max_tokens")
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad(
            "invalid_value", "'max_tokens' must be a whole number of at least 1", "max_tokens"
        )
    if "messages" not in body:
        raise bad("missing_field", "'messages' is required", "messages")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise bad("invalid_type", "'messages' must be a non-empty array of messages", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad("invalid_type", f"'{where}' must be an object", where)
        if message.get("role") not in ("user", "assistant"):
            raise bad(
                "invalid_value", f"'{where}.role' must be 'user' or 'assistant'", f"{where}.role"
            )
        content = message.get("content")
        if isinstance(content, list):
            for part_index, block in enumerate(content):
                kind = block.get("type") if isinstance(block, dict) else None
                part = f"{where}.content[{part_index}]"
                if not isinstance(kind, str):
                    raise bad("invalid_type", f"'{part}' must be a content block with a type", part)
                if kind not in BLOCK_TYPES:
                    raise bad(
                        "invalid_value",
                        f"'{part}.type' must be a known content block type "
                        f"({', '.join(sorted(BLOCK_TYPES))})",
                        f"{part}.type",
                    )
                anthropic_block(block, kind, part)
        elif not isinstance(content, str):
            raise bad(
                "invalid_type",
                f"'{where}.content' must be a string or an array of content blocks",
                f"{where}.content",
            )
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise bad("invalid_type", "'system' must be a string or an array of text blocks", "system")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("invalid_type", "'stream' must be true or false", "stream")
    for key, types, what in (
        ("tools", (list,), "an array"),
        ("tool_choice", (dict,), "an object"),
        ("metadata", (dict,), "an object"),
        ("stop_sequences", (list,), "an array of strings"),
        ("temperature", (int, float), "a number"),
        ("top_p", (int, float), "a number"),
        ("top_k", (int,), "a whole number"),
    ):
        value = body.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise bad("invalid_type", f"'{key}' must be {what}", key)
    for key, members in ANTHROPIC_MEMBERS.items():
        value = body.get(key)
        if value is not None:
            members(value)
    return model, stream


def event_kind(data: bytes) -> tuple[ChunkKind, Any]:
    """Classify one stream event by its data's ``type``."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ChunkKind.INVALID, None
    if not isinstance(payload, dict):
        return ChunkKind.ERROR, payload
    kind = payload.get("type")
    try:
        if kind == "content_block_delta":
            delta = payload.get("delta") or {}
            empty = delta.get("type") == "text_delta" and not delta.get("text")
            return (ChunkKind.PRELUDE if empty else ChunkKind.CONTENT), payload
        if kind == "content_block_start":
            block = payload.get("content_block") or {}
            # A tool call's start already carries content (the tool's name).
            is_text = block.get("type") == "text"
            return (ChunkKind.PRELUDE if is_text else ChunkKind.CONTENT), payload
    except AttributeError:
        return ChunkKind.ERROR, payload  # not an event: members of the wrong shape
    if kind == "message_delta":
        return ChunkKind.CONTENT, payload
    if kind == "message_stop":
        return ChunkKind.DONE, payload
    if kind == "error":
        return ChunkKind.ERROR, payload
    return ChunkKind.PRELUDE, payload


def answer_problem(endpoint: Endpoint, payload: Any) -> str | None:
    """Why a 200 body is not a Messages answer, or None when it is one (or is an error)."""
    if not isinstance(payload, dict):
        return "200 without a JSON answer"
    kind = payload.get("type")
    if kind == "error":
        return None  # the classifier reads it
    if kind != "message":
        return "200 whose type is not message"
    content = payload.get("content")
    if not isinstance(content, list):
        return "message without content"
    for block in content:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return "message with a content block that has no type"
    return None


def answer_chars(payload: Any) -> int:
    """Characters of answer text in a whole message (text, tool input, thinking)."""
    total = 0
    for block in payload.get("content") or ():
        for key in ("text", "thinking"):
            text = block.get(key)
            if isinstance(text, str):
                total += len(text)
        if "input" in block:
            total += len(orjson.dumps(block["input"]))
    return total


def digest(payload: Any) -> tuple[int, str | None]:
    """One content event: characters of answer text, and the stop reason if it ends the message."""
    kind = payload.get("type")
    if kind == "message_delta":
        return 0, _reason(payload.get("delta"))
    if kind != "content_block_delta":
        return 0, None
    delta = payload.get("delta") or {}
    text = delta.get("text") or delta.get("partial_json") or delta.get("thinking") or ""
    return (len(text) if isinstance(text, str) else 0), None


def finish_reason(payload: Any) -> str | None:
    """A whole message's stop reason."""
    return _reason(payload) if isinstance(payload, dict) and payload.get("stop_reason") else None


def _reason(holder: Any) -> str:
    """``stop_reason`` of a message or message_delta's delta, fit for a label."""
    value = holder.get("stop_reason") if isinstance(holder, dict) else None
    return value[:32] if isinstance(value, str) and value else "other"


#: Reasoning blocks whose text cannot tell what they cost: a thinking block's
#: text may be a summary of the thinking billed (Claude 4) or omitted, and a
#: redacted one is encrypted.
_REASONING_BLOCKS = ("thinking", "redacted_thinking")


def _has_reasoning(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") in _REASONING_BLOCKS for block in content
    )


def usage_update(previous: Usage | None, payload: Any) -> Usage | None:
    """Usage from a whole message, a message_start or a message_delta, merged over ``previous``.

    Prism's ``input_tokens`` counts every prompt token, cached or not, so
    Anthropic's separate cache counts are added back in.  The thinking share
    of the output (``output_tokens_details.thinking_tokens``) is
    ``reasoning_tokens``; a reasoning block (in a whole message, or a
    stream's content_block_start) marks ``reasoning_unmeasured``.
    """
    if not isinstance(payload, dict):
        return previous
    kind = payload.get("type")
    if kind == "message_start":
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
    elif kind in ("message_delta", "message"):
        usage = payload.get("usage")
    elif kind == "content_block_start":
        # The stream's report so far (message_start's) carries the mark to its end.
        if (
            previous is None
            or previous.reasoning_unmeasured
            or not _has_reasoning([payload.get("content_block")])
        ):
            return previous
        return attrs.evolve(previous, reasoning_unmeasured=True)
    else:
        return previous
    if not isinstance(usage, dict):
        return previous
    base = previous or Usage()
    counts = {
        key: token_count(usage[key])
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        )
        if usage.get(key) is not None
    }
    details = usage.get("output_tokens_details")
    if isinstance(details, dict) and details.get("thinking_tokens") is not None:
        counts["thinking_tokens"] = token_count(details["thinking_tokens"])
    if None in counts.values():
        return Usage(suspect=True)
    read = counts.get("cache_read_input_tokens")
    created = counts.get("cache_creation_input_tokens")
    fresh = counts.get("input_tokens")
    cached = read if read is not None else base.cached_input_tokens
    creation = created if created is not None else base.cache_creation_tokens
    if fresh is not None:
        input_tokens = fresh + cached + creation
    else:
        input_tokens = base.input_tokens
    output = counts.get("output_tokens")
    thinking = counts.get("thinking_tokens")
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output if output is not None else base.output_tokens,
        cached_input_tokens=cached,
        cache_creation_tokens=creation,
        reasoning_tokens=thinking if thinking is not None else base.reasoning_tokens,
        suspect=base.suspect,
        reasoning_unmeasured=base.reasoning_unmeasured
        or (kind == "message" and _has_reasoning(payload.get("content"))),
    )


def error_payload(err: PrismError) -> dict[str, Any]:
    error: dict[str, Any] = {
        "type": _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else err.type),
        "message": err.message,
        "code": err.code,
    }
    if err.param:
        error["param"] = err.param
    error.update(err.extra)
    return {"type": "error", "error": error}


def error_body(err: PrismError) -> bytes:
    return orjson.dumps(error_payload(err))


def error_event(err: PrismError) -> bytes:
    return b"event: error\ndata: " + orjson.dumps(error_payload(err)) + b"\n\n"


def message_body(message_id: str, model: str, text: str) -> dict[str, Any]:
    """A whole message answered by Prism itself (the degraded answer)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def sse(payload: dict[str, Any]) -> bytes:
    """One Anthropic stream event: its type as the SSE event name, then the data."""
    return (
        b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
    )


def message_events(message_id: str, model: str, text: str) -> bytes:
    """The same answer as a complete stream, ``message_stop`` included."""
    start = message_body(message_id, model, "")
    start["content"] = []
    start["stop_reason"] = None
    return b"".join(
        [
            sse({"type": "message_start", "message": start}),
            sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }
            ),
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                }
            ),
            sse({"type": "content_block_stop", "index": 0}),
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 0},
                }
            ),
            DONE_EVENT,
        ]
    )


def estimate_usage(body: dict[str, Any], delivered_chars: int) -> Usage:
    """Usage of a cut stream when the provider never reported it: about 4 characters a token."""
    chars = 0
    system = body.get("system")
    blocks: list[Any] = [system] if isinstance(system, str) else list(system or ())
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks.extend([content] if isinstance(content, str) else list(content or ()))
    chars += sum(len(block) for block in blocks if isinstance(block, str))
    return estimated_usage(chars + text_chars(blocks), delivered_chars)


def degraded_body(suffix: str, model: str, text: str) -> dict[str, Any]:
    return message_body("msg_" + suffix, model, text)


def degraded_events(suffix: str, model: str, text: str) -> bytes:
    return message_events("msg_" + suffix, model, text)
