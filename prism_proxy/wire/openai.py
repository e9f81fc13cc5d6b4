"""The OpenAI wire format: request validation, stream chunk inspection, usage, error shapes."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import orjson

from ..call import Endpoint, Usage, token_count
from ..errors import PrismError
from .chat_parts import estimated_usage, text_chars
from .events import ChunkKind
from .shape import CHAT_MEMBERS, bad, member, openai_message, openai_part

__all__ = [
    "ChunkKind",
    "chunk_kind",
    "error_event",
    "error_payload",
    "usage_from",
    "validate_chat",
    "validate_embeddings",
]

DONE_EVENT = b"data: [DONE]\n\n"


def _require_str(body: dict[str, Any], key: str) -> str:
    if key not in body:
        raise bad("missing_field", f"'{key}' is required", key)
    value = body[key]
    if not isinstance(value, str) or not value:
        raise bad("invalid_type", f"'{key}' must be a non-empty string", key)
    return value


#: Optional chat fields whose type Prism checks, with the types allowed and
#: how the error names them.  Only fields present are looked at.
_CHAT_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "stream": ((bool,), "true or false"),
    "stream_options": ((dict,), "an object"),
    "max_tokens": ((int,), "a whole number"),
    "max_completion_tokens": ((int,), "a whole number"),
    "n": ((int,), "a whole number"),
    "temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "presence_penalty": ((int, float), "a number"),
    "frequency_penalty": ((int, float), "a number"),
    "tools": ((list,), "an array"),
    "tool_choice": ((str, dict), "a string or an object"),
    "parallel_tool_calls": ((bool,), "true or false"),
    "stop": ((str, list), "a string or an array of strings"),
    "user": ((str,), "a string"),
    "response_format": ((dict,), "an object"),
    "modalities": ((list,), "an array of strings"),
    "metadata": ((dict,), "an object"),
}
_AT_LEAST_ONE = ("max_tokens", "max_completion_tokens", "n")


def _check_chat_fields(body: dict[str, Any]) -> None:
    # The body's few keys, not the table's many: most bodies hold three or four.
    for key in body:
        field = _CHAT_FIELDS.get(key)
        if field is None:
            continue
        types, what = field
        value = member(body, key, "", types, what)
        if key in _AT_LEAST_ONE and value is not None and value < 1:
            raise bad("invalid_value", f"'{key}' must be at least 1", key)
        members = CHAT_MEMBERS.get(key)
        if members is not None and value is not None:
            members(value)


#: The roles and content part types of the Chat Completions API; the upstream
#: rejects anything else, but only after the call was dispatched (and billed).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
#: Roles whose messages carry nothing but their content (assistant and tool
#: messages carry tool calls and call ids, checked one by one).
_PLAIN_ROLES = frozenset({"system", "developer", "user"})


def _check_parts(parts: list[Any], where: str) -> None:
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}.content[{index}]"
        if not isinstance(kind, str):
            raise bad("invalid_type", f"'{at}' must be a content part with a type", at)
        if kind not in PART_TYPES:
            raise bad(
                "invalid_value",
                f"'{at}.type' must be one of {', '.join(sorted(PART_TYPES))}",
                f"{at}.type",
            )
        openai_part(part, kind, at)


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise bad("invalid_type", f"'{where}' must be an object", where)
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise bad("invalid_type", f"'{where}.role' must be a non-empty string", f"{where}.role")
    if role not in ROLES:
        raise bad(
            "invalid_value",
            f"'{where}.role' must be one of {', '.join(sorted(ROLES))}",
            f"{where}.role",
        )
    content = message.get("content")
    if isinstance(content, list):
        _check_parts(content, where)
    elif content is not None and not isinstance(content, str):
        raise bad(
            "invalid_type",
            f"'{where}.content' must be a string or an array of content parts",
            f"{where}.content",
        )
    openai_message(message, role, where)


def validate_chat(body: dict[str, Any]) -> tuple[str, bool, bool]:
    """Check a chat completion request; returns (model, stream, include_usage)."""
    model = _require_str(body, "model")
    if "messages" not in body:
        raise bad("missing_field", "'messages' is required", "messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad("invalid_type", "'messages' must be an array of message objects", "messages")
    if not messages:
        raise bad("invalid_value", "'messages' must contain at least one message", "messages")
    for index, message in enumerate(messages):
        # Most messages pass these tests; the rest are judged, and named, one by one.
        if isinstance(message, dict):
            role, content = message.get("role"), message.get("content")
            if (
                type(role) is str
                and role in _PLAIN_ROLES
                and (content is None or type(content) is str)
            ):
                continue
        _check_message(message, f"messages[{index}]")
    _check_chat_fields(body)
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        flag = options.get("include_usage")
        if flag is not None and not isinstance(flag, bool):
            raise bad(
                "invalid_type",
                "'stream_options.include_usage' must be true or false",
                "stream_options.include_usage",
            )
        include_usage = bool(flag)
    return model, stream, include_usage


def validate_embeddings(body: dict[str, Any]) -> str:
    """Check an embeddings request; returns the model."""
    model = _require_str(body, "model")
    if "input" not in body:
        raise bad("missing_field", "'input' is required", "input")
    value = body["input"]
    ok = isinstance(value, str) and value != ""
    if isinstance(value, list) and value:
        ok = (
            all(isinstance(item, str) for item in value)
            or all(isinstance(item, int) and not isinstance(item, bool) for item in value)
            or all(
                isinstance(item, list)
                and item
                and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
                for item in value
            )
        )
    if not ok:
        raise bad(
            "invalid_type",
            "'input' must be a non-empty string, array of strings, or array of token arrays",
            "input",
        )
    fmt = member(body, "encoding_format", "", (str,), "a string")
    if fmt is not None and fmt not in ("float", "base64"):
        raise bad(
            "invalid_value", "'encoding_format' must be 'float' or 'base64'", "encoding_format"
        )
    dims = member(body, "dimensions", "", (int,), "a whole number")
    if dims is not None and dims < 1:
        raise bad("invalid_value", "'dimensions' must be at least 1", "dimensions")
    return model


# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_DONE, _USAGE = ChunkKind.DONE, ChunkKind.USAGE


def chunk_kind(data: bytes) -> tuple[ChunkKind, Any]:
    """Classify one stream event's data; returns the kind and the parsed payload."""
    if data == b"[DONE]":
        return _DONE, None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ChunkKind.INVALID, None
    if not isinstance(payload, dict):
        return ChunkKind.ERROR, payload
    choices = payload.get("choices")
    if choices is None:
        return (ChunkKind.ERROR if "error" in payload else ChunkKind.PRELUDE), payload
    try:
        if not choices:
            return (_USAGE if payload.get("usage") else ChunkKind.PRELUDE), payload
        for choice in choices:
            if choice.get("finish_reason"):
                return ChunkKind.CONTENT, payload
            delta = choice.get("delta") or {}
            if (
                delta.get("content")
                or delta.get("tool_calls")
                or delta.get("refusal")
                or delta.get("function_call")
            ):
                return ChunkKind.CONTENT, payload
    except (AttributeError, TypeError):
        return ChunkKind.ERROR, payload  # not a chunk: members of the wrong shape
    return ChunkKind.PRELUDE, payload


# gc=False: decoded chunks hold only strings, lists and each other, so they can
# never be part of a reference cycle; untracked, they cost less to make and free.
class _Function(msgspec.Struct, gc=False):
    arguments: str | None = None


class _ToolCall(msgspec.Struct, gc=False):
    function: _Function | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    refusal: str | None = None
    #: The deprecated single function call: only whether it is there matters.
    function_call: Any = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Object(msgspec.Struct, gc=False):
    """Any JSON object, its members skipped: only that it is there matters."""


class _Chunk(msgspec.Struct, gc=False):
    """The members of a chunk that decide whether it can be forwarded unparsed."""

    choices: list[_Choice] | None = None
    #: A usage chunk ends a run (it is parsed on its own): not built here.
    usage: _Object | None = None


#: Decodes only those members: the rest of each chunk is checked to be JSON and
#: skipped, so a chunk costs no Python objects but these few.
_CHUNK = msgspec.json.Decoder(_Chunk)
#: What it raises for an event that is not one, and for one nested too deep.
_NOT_A_CHUNK = (msgspec.DecodeError, RecursionError)


def _call_chars(calls: list[_ToolCall] | None) -> int:
    """Characters of the arguments in a chunk's tool calls."""
    chars = 0
    for call in calls or ():
        function = call.function
        if function is not None and function.arguments is not None:
            chars += len(function.arguments)
    return chars


def plain_run(datas: list[bytes]) -> tuple[int, int, str | None, int]:
    """How many of ``datas`` (events' data, in order) lead that are plain chunks,
    their characters of answer text, the finish reason the last of them gave,
    and the index of the first of them that carries content (-1: none does).

    A plain chunk is JSON with choices (a role prelude, text, tool calls, a
    refusal, a finish) and no usage: what a relay learns from it is
    what :func:`chunk_kind` and :func:`digest` would, without building the
    chunk.  Anything else (not JSON, an error, usage, a shape those members do
    not have) ends the run and is parsed on its own.  The strings it skips
    are not checked to be UTF-8.
    """
    decode = _CHUNK.decode
    chars = 0
    count = 0
    first_content = -1
    finished: str | None = None
    try:
        for data in datas:
            chunk = decode(data)
            choices = chunk.choices
            if not choices or chunk.usage is not None:
                break
            # Text first: most chunks carry nothing else.
            for choice in choices:
                delta = choice.delta
                if delta is not None:
                    text = delta.content
                    if text:
                        chars += len(text)
                        if first_content < 0:
                            first_content = count
                    if delta.tool_calls or delta.refusal or delta.function_call:
                        chars += _call_chars(delta.tool_calls)
                        if first_content < 0:
                            first_content = count
                if choice.finish_reason:
                    finished = _reason(choice.finish_reason)
                    if first_content < 0:
                        first_content = count
            count += 1
    except _NOT_A_CHUNK:
        pass
    return count, chars, finished, first_content


def answer_problem(endpoint: Endpoint, payload: Any) -> str | None:
    """Why a 200 body is not an answer of ``endpoint``, or None when it is one (or is an error)."""
    if not isinstance(payload, dict):
        return "200 without a JSON answer"
    if endpoint is Endpoint.EMBEDDINGS:
        data = payload.get("data")
        if not isinstance(data, list) or not data:
            return None if "error" in payload else "embeddings answer without data"
        for item in data:
            if not isinstance(item, dict) or not isinstance(item.get("embedding"), list | str):
                return "embeddings answer with an item that has no embedding"
        return None
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return None if "error" in payload else "answer without choices"
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            return "answer with a choice that has no message"
    return None


def finish_reason(payload: Any) -> str | None:
    """The first choice's finish reason in a whole completion."""
    for choice in payload.get("choices") or ():
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return _reason(choice["finish_reason"])
    return None


def _reason(value: Any) -> str:
    """A finish reason fit for a label: a short word, whatever the upstream sent."""
    return value[:32] if isinstance(value, str) else "other"


def answer_chars(payload: Any) -> int:
    """Characters of answer text in a whole completion (content, refusals, tool arguments)."""
    total = 0
    for choice in payload.get("choices") or ():
        message = choice["message"]
        for key in ("content", "refusal"):
            text = message.get(key)
            if isinstance(text, str):
                total += len(text)
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                total += len(arguments)
    return total


def digest(payload: Any) -> tuple[int, str | None]:
    """One pass over a content chunk: characters of answer text, and its finish reason.

    The characters estimate the usage of a stream cut before its usage chunk.
    """
    total = 0
    finished: str | None = None
    for choice in payload["choices"]:
        reason = choice.get("finish_reason")
        if reason:
            finished = _reason(reason)
        delta = choice.get("delta")
        if not delta:
            continue
        content = delta.get("content")
        if isinstance(content, str):
            total += len(content)
        for call in delta.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments")
            if isinstance(arguments, str):
                total += len(arguments)
    return total, finished


def usage_from(payload: Any) -> Usage | None:
    """The usage object of a completion, chunk or embeddings answer, if present.

    A count that is not a whole number >= 0 makes the whole report ``suspect``
    (the relay then estimates instead of trusting any of it).
    """
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    output_details = usage.get("completion_tokens_details")
    raw = (
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        (details.get("cached_tokens") if isinstance(details, dict) else None) or 0,
        (output_details.get("reasoning_tokens") if isinstance(output_details, dict) else None) or 0,
    )
    for value in raw:
        if token_count(value) is None:
            return Usage(suspect=True)
    prompt, completion, cached, reasoning = raw
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        cached_input_tokens=cached,
        reasoning_tokens=reasoning,
    )


def error_payload(err: PrismError) -> dict[str, Any]:
    error: dict[str, Any] = {
        "message": err.message,
        "type": err.type,
        "param": err.param,
        "code": err.code,
    }
    error.update(err.extra)
    return {"error": error}


def usage_update(previous: Usage | None, payload: Any) -> Usage | None:
    if not payload or payload.get("usage") is None:
        return previous  # the common case: a chunk with "usage": null, or none at all
    return usage_from(payload) or previous


def error_body(err: PrismError) -> bytes:
    return orjson.dumps(error_payload(err))


def error_event(err: PrismError) -> bytes:
    """The explicit error event that ends a stream which broke after its commit point."""
    return b"data: " + orjson.dumps(error_payload(err)) + b"\n\n"


def estimate_usage(body: dict[str, Any], delivered_chars: int) -> Usage:
    """Usage of a cut stream when the provider never reported it: about 4 characters a token."""
    prompt_chars = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            prompt_chars += len(content)
        elif isinstance(content, list):
            prompt_chars += text_chars(content)
    return estimated_usage(prompt_chars, delivered_chars)


def completion_body(completion_id: str, model: str, text: str, created: int) -> dict[str, Any]:
    """A whole chat completion answered by Prism itself (the degraded answer)."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def completion_events(completion_id: str, model: str, text: str, created: int) -> bytes:
    """The same answer as a stream: role and content, finish, then ``[DONE]``."""
    head = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    chunks = [
        {
            **head,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
            ],
        },
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + DONE_EVENT


def degraded_body(suffix: str, model: str, text: str) -> dict[str, Any]:
    return completion_body("chatcmpl-" + suffix, model, text, int(time.time()))


def degraded_events(suffix: str, model: str, text: str) -> bytes:
    return completion_events("chatcmpl-" + suffix, model, text, int(time.time()))
