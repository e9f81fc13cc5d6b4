"""The OpenAI wire format: chat completions (plain and SSE), responses, embeddings, models."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import orjson
from aiohttp import web

from .answers import (
    content_text,
    count_message_words,
    count_words,
    default_answer,
    split_tokens,
    tool_arguments,
    tool_arguments_json,
    tool_result_answer,
)
from .exchange import Exchange, Route, WireFormat, json_bytes, stream_answer
from .openai_responses import responses
from .vectors import embedding_for_text, embedding_for_tokens, unpack_floats

__all__ = [
    "DEFAULT_EMBEDDING_DIMS",
    "DEFAULT_MODELS",
    "error_body",
    "error_response",
    "openai_wire",
]

DEFAULT_MODELS: tuple[str, ...] = ("fake-model", "gpt-4o-mini", "text-embedding-3-small")
DEFAULT_EMBEDDING_DIMS = 8
# Far above any real model; only here so a typo cannot allocate gigabytes.
MAX_EMBEDDING_DIMS = 16_384
SYSTEM_FINGERPRINT = "fp_fake"

_JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})
_SSE_HEADERS: Mapping[str, str] = MappingProxyType(
    {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
)
_DONE = b"data: [DONE]\n\n"

# (type, code, message) as api.openai.com sends them for common statuses.
_ERROR_DEFAULTS: Mapping[int, tuple[str, str | None, str]] = MappingProxyType(
    {
        400: ("invalid_request_error", None, "Invalid request."),
        401: (
            "invalid_request_error",
            "invalid_api_key",
            "Incorrect API key provided. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
        ),
        403: ("invalid_request_error", None, "You are not allowed to access this resource."),
        404: ("invalid_request_error", None, "The requested resource does not exist."),
        429: (
            "requests",
            "rate_limit_exceeded",
            "Rate limit reached for requests. Please try again later.",
        ),
        500: (
            "server_error",
            None,
            "The server had an error while processing your request. Sorry about that!",
        ),
        503: ("server_error", None, "The engine is currently overloaded, please try again later."),
    }
)


def _error_defaults(status: int) -> tuple[str, str | None, str]:
    known = _ERROR_DEFAULTS.get(status)
    if known is not None:
        return known
    if status >= 500:
        return ("server_error", None, f"The server returned an error ({status}).")
    return ("invalid_request_error", None, f"The request failed ({status}).")


def error_body(
    status: int, message: str | None = None, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    err_type, default_code, default_message = _error_defaults(status)
    return {
        "error": {
            "message": message if message is not None else default_message,
            "type": err_type,
            "param": param,
            "code": code if code is not None else default_code,
        }
    }


def error_response(
    status: int, message: str | None = None, headers: Mapping[str, str] = _JSON_HEADERS
) -> web.Response:
    merged = {**_JSON_HEADERS, **headers}
    if status in (204, 304):
        # These statuses may not carry a body at all.
        return web.Response(status=status, headers=merged)
    return web.Response(
        status=status, body=orjson.dumps(error_body(status, message)), headers=merged
    )


def _invalid(ex: Exchange, message: str, param: str | None) -> web.Response:
    return web.Response(
        status=400,
        body=orjson.dumps(error_body(400, message, param)),
        headers=ex.response_headers(_JSON_HEADERS),
    )


def _context_refusal(ex: Exchange, limit: int, prompt: int) -> web.Response:
    """api.openai.com's answer to a prompt longer than the model's context window."""
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {prompt} tokens. Please reduce the length of the messages."
    )
    return web.Response(
        status=400,
        body=orjson.dumps(error_body(400, message, "messages", "context_length_exceeded")),
        headers=ex.response_headers(_JSON_HEADERS),
    )


def _json(ex: Exchange, payload: Any) -> web.Response:
    return web.Response(body=json_bytes(payload), headers=ex.response_headers(_JSON_HEADERS))


def _int_field(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _usage(
    prompt_tokens: int, completion_tokens: int, override: Mapping[str, Any] | None
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    if override:
        usage.update(override)
    return usage


@attrs.frozen
class _ChunkFrames:
    """Byte templates for one stream's SSE events.

    Every chunk of a stream shares id/created/model, so the envelope is
    encoded once and only the delta is serialised per chunk.
    """

    head: bytes  # 'data: {...,"choices":['
    tail: bytes  # '],"usage":null}\n\n' or ']}\n\n'

    @classmethod
    def for_request(
        cls, completion_id: str, created: int, model: str, with_usage: bool
    ) -> _ChunkFrames:
        head = b"".join(
            (
                b'data: {"id":',
                orjson.dumps(completion_id),
                b',"object":"chat.completion.chunk","created":',
                str(created).encode(),
                b',"model":',
                orjson.dumps(model),
                b',"service_tier":"default","system_fingerprint":"',
                SYSTEM_FINGERPRINT.encode(),
                b'","choices":[',
            )
        )
        # With include_usage every chunk carries "usage": null, as OpenAI does.
        tail = b'],"usage":null}\n\n' if with_usage else b"]}\n\n"
        return cls(head, tail)

    def role(self) -> bytes:
        return (
            self.head
            + b'{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
            + b'"logprobs":null,"finish_reason":null}'
            + self.tail
        )

    def content(self, token: str) -> bytes:
        return (
            self.head
            + b'{"index":0,"delta":{"content":'
            + orjson.dumps(token)
            + b'},"logprobs":null,"finish_reason":null}'
            + self.tail
        )

    def tool_call(self, call_id: str, name: str) -> bytes:
        # The first chunk of a tool call carries the role, the call's id, type
        # and name, and empty arguments; the arguments follow in pieces.
        return (
            self.head
            + b'{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,'
            + b'"id":'
            + orjson.dumps(call_id)
            + b',"type":"function","function":{"name":'
            + orjson.dumps(name)
            + b',"arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}'
            + self.tail
        )

    def arguments(self, fragment: str) -> bytes:
        return (
            self.head
            + b'{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":'
            + orjson.dumps(fragment)
            + b'}}]},"logprobs":null,"finish_reason":null}'
            + self.tail
        )

    def finish(self, reason: str) -> bytes:
        return (
            self.head
            + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":'
            + orjson.dumps(reason)
            + b"}"
            + self.tail
        )

    def usage(self, usage: Mapping[str, Any]) -> bytes:
        return self.head + b'],"usage":' + json_bytes(usage) + b"}\n\n"


def _stream_error_event(error: Mapping[str, Any]) -> bytes:
    # Accept both the inner error object and an already wrapped {"error": {...}}.
    payload = error if set(error) == {"error"} else {"error": error}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


@attrs.frozen
class _ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text
    fragments: list[str]  # how the arguments are streamed; they join to ``arguments``

    def message_entry(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _final_tool_results(messages: Sequence[Any]) -> list[str]:
    """Contents of the tool messages the conversation ends with, in order."""
    results: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            break
        results.append(content_text(message.get("content")))
    results.reverse()
    return results


def _tool_call(body: Mapping[str, Any]) -> _ToolCall | None:
    """The call a request with ``tools`` gets, or None (no tools, tool_choice "none")."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    named: Any = None
    if isinstance(choice, dict):
        function = choice.get("function")
        if isinstance(function, dict):
            named = function.get("name")
    candidates: list[Mapping[str, Any]] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            candidates.append(function)
    if not candidates:
        return None
    chosen = next((f for f in candidates if f["name"] == named), candidates[0])
    arguments, fragments = tool_arguments_json(tool_arguments(chosen.get("parameters")))
    return _ToolCall("call_" + os.urandom(12).hex(), chosen["name"], arguments, fragments)


async def _stream_chat(
    ex: Exchange,
    frames: _ChunkFrames,
    opening: bytes,
    chunk: Callable[[str], bytes],
    tokens: Sequence[str],
    finish_reason: str,
    usage: Mapping[str, Any],
    include_usage: bool,
) -> web.StreamResponse:
    """Stream ``opening``, then ``chunk(t)`` for each token, then the finish."""
    closing = [frames.finish(finish_reason)]
    if include_usage:
        closing.append(frames.usage(usage))
    closing.append(_DONE)
    return await stream_answer(
        ex,
        _SSE_HEADERS,
        opening,
        [chunk(token) for token in tokens],
        b"".join(closing),
        _stream_error_event,
    )


async def _chat_completions(ex: Exchange) -> web.StreamResponse:
    body = ex.body
    if not isinstance(body, dict):
        return _invalid(ex, "We could not parse the JSON body of your request.", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _invalid(ex, "you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _invalid(ex, "'messages' must be a non-empty array.", "messages")

    fault = ex.fault
    if fault.context_limit is not None:
        prompt = count_message_words(messages)
        if prompt > fault.context_limit:
            return _context_refusal(ex, fault.context_limit, prompt)
    stream = body.get("stream") is True
    if fault.die_after_chunks is not None and not stream:
        return ex.hang_up()

    call: _ToolCall | None = None
    if fault.empty_length:
        tokens: list[str] = []
        finish_reason = "length"
    else:
        # See the README's "Tool calls" rule: a final tool message is answered
        # with text, otherwise ``tools`` get a call of the first (or the
        # named) tool unless tool_choice is "none".
        text = fault.text
        if text is None:
            last = messages[-1]
            if isinstance(last, dict) and last.get("role") == "tool":
                text = tool_result_answer(_final_tool_results(messages))
            elif "tools" in body:
                call = _tool_call(body)
        if call is not None:
            tokens = call.fragments
            finish_reason = "tool_calls"
        else:
            tokens = split_tokens(text if text is not None else default_answer(model))
            finish_reason = "stop"
            limit = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
            if limit is not None and 0 < limit < len(tokens):
                tokens = tokens[:limit]
                finish_reason = "length"

    usage = _usage(count_message_words(messages), len(tokens), fault.usage)
    completion_id = "chatcmpl-" + os.urandom(12).hex()
    created = int(time.time())

    if stream:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        frames = _ChunkFrames.for_request(completion_id, created, model, include_usage)
        chunk: Callable[[str], bytes]
        if call is not None:
            opening, chunk = frames.tool_call(call.call_id, call.name), frames.arguments
        else:
            opening, chunk = frames.role(), frames.content
        return await _stream_chat(
            ex, frames, opening, chunk, tokens, finish_reason, usage, include_usage
        )

    # A real upstream takes as long to answer as it takes to generate.
    await ex.pause(fault.first_token_delay_s + fault.token_delay_s * max(len(tokens) - 1, 0))
    return _json(
        ex,
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _message(tokens, call),
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage,
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        },
    )


def _message(tokens: Sequence[str], call: _ToolCall | None) -> dict[str, Any]:
    if call is not None:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [call.message_entry()],
            "refusal": None,
            "annotations": [],
        }
    return {
        "role": "assistant",
        "content": "".join(tokens),
        "refusal": None,
        "annotations": [],
    }


def _embedding_inputs(raw: Any) -> list[str | list[int]] | None:
    """Normalise the four accepted ``input`` shapes to a list of items."""

    def is_token(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        return None
    if all(isinstance(v, str) for v in raw):
        return list(raw)
    if all(is_token(v) for v in raw):
        return [list(raw)]
    if all(isinstance(v, list) and v and all(is_token(t) for t in v) for v in raw):
        return [list(v) for v in raw]
    return None


async def _embeddings(ex: Exchange) -> web.StreamResponse:
    body = ex.body
    if not isinstance(body, dict):
        return _invalid(ex, "We could not parse the JSON body of your request.", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _invalid(ex, "you must provide a model parameter", "model")
    items = _embedding_inputs(body.get("input"))
    if items is None:
        return _invalid(
            ex,
            "'input' must be a string, an array of strings, an array of integers "
            "or an array of integer arrays.",
            "input",
        )
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ("float", "base64"):
        return _invalid(ex, "'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    dims = body.get("dimensions", DEFAULT_EMBEDDING_DIMS)
    if dims is None:
        dims = DEFAULT_EMBEDDING_DIMS
    if not isinstance(dims, int) or isinstance(dims, bool) or not 0 < dims <= MAX_EMBEDDING_DIMS:
        return _invalid(ex, "'dimensions' must be a positive integer.", "dimensions")

    if ex.fault.die_after_chunks is not None:
        return ex.hang_up()
    await ex.pause(ex.fault.first_token_delay_s)

    data: list[dict[str, Any]] = []
    prompt_tokens = 0
    for index, item in enumerate(items):
        if isinstance(item, str):
            packed = embedding_for_text(item, dims)
            prompt_tokens += max(count_words(item), 1)
        else:
            packed = embedding_for_tokens(item, dims)
            prompt_tokens += len(item)
        vector: str | list[float] = (
            base64.b64encode(packed).decode() if encoding == "base64" else unpack_floats(packed)
        )
        data.append({"object": "embedding", "index": index, "embedding": vector})
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    if ex.fault.usage:
        usage.update(ex.fault.usage)
    return _json(ex, {"object": "list", "data": data, "model": model, "usage": usage})


def openai_wire(models: Sequence[str] = DEFAULT_MODELS) -> WireFormat:
    """The OpenAI wire format, listing ``models`` on GET /models."""
    created = int(time.time())
    objects = {
        m: {"id": m, "object": "model", "created": created, "owned_by": "prism-fake-upstream"}
        for m in models
    }
    # The list never changes for this fake, so it is encoded once.
    models_body = orjson.dumps({"object": "list", "data": list(objects.values())})

    async def list_models(ex: Exchange) -> web.StreamResponse:
        if ex.fault.die_after_chunks is not None:
            return ex.hang_up()
        await ex.pause(ex.fault.first_token_delay_s)
        return web.Response(body=models_body, headers=ex.response_headers(_JSON_HEADERS))

    async def get_model(ex: Exchange) -> web.StreamResponse:
        if ex.fault.die_after_chunks is not None:
            return ex.hang_up()
        await ex.pause(ex.fault.first_token_delay_s)
        model_id = ex.endpoint.removeprefix("models/")
        obj = objects.get(model_id)
        if obj is None:
            return web.Response(
                status=404,
                body=orjson.dumps(
                    error_body(
                        404, f"The model '{model_id}' does not exist", "model", "model_not_found"
                    )
                ),
                headers=ex.response_headers(_JSON_HEADERS),
            )
        return _json(ex, obj)

    return WireFormat(
        name="openai",
        routes=(
            Route("POST", "chat/completions", _chat_completions),
            Route("POST", "responses", responses),
            Route("POST", "embeddings", _embeddings),
            Route("GET", "models", list_models),
            Route("GET", "models/{model_id}", get_model),
        ),
        error_response=error_response,
    )
