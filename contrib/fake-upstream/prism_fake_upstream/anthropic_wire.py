"""The Anthropic wire format: POST /v1/messages, plain and SSE streaming.

Field names and event order follow api.anthropic.com (and the ``anthropic``
SDK's types): ``message_start``, ``content_block_start``, ``ping``,
``content_block_delta``…, ``content_block_stop``, ``message_delta``,
``message_stop``, each sent as ``event: <type>`` + ``data: <json>``.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import orjson
from aiohttp import web

from .answers import (
    content_text,
    count_words,
    default_answer,
    split_tokens,
    tool_arguments,
    tool_arguments_json,
    tool_result_answer,
)
from .exchange import Exchange, Route, WireFormat, json_bytes, stream_answer

__all__ = ["anthropic_wire", "error_body", "error_response"]

_JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})
_SSE_HEADERS: Mapping[str, str] = MappingProxyType(
    {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
)

# (type, message) as api.anthropic.com sends them for the documented statuses.
_ERROR_DEFAULTS: Mapping[int, tuple[str, str]] = MappingProxyType(
    {
        400: ("invalid_request_error", "Invalid request."),
        401: ("authentication_error", "invalid x-api-key"),
        402: ("billing_error", "Your credit balance is too low to access the Anthropic API."),
        403: (
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        ),
        404: ("not_found_error", "Not found."),
        413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
        429: (
            "rate_limit_error",
            "This request would exceed the rate limit for your organization. "
            "Please try again later.",
        ),
        500: ("api_error", "Internal server error"),
        504: ("timeout_error", "Request timed out."),
        529: ("overloaded_error", "Overloaded"),
    }
)


def _error_defaults(status: int) -> tuple[str, str]:
    known = _ERROR_DEFAULTS.get(status)
    if known is not None:
        return known
    if status >= 500:
        return ("api_error", f"The server returned an error ({status}).")
    return ("invalid_request_error", f"The request failed ({status}).")


def _request_id() -> str:
    return "req_" + os.urandom(12).hex()


def error_body(
    status: int, message: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    err_type, default_message = _error_defaults(status)
    return {
        "type": "error",
        "error": {
            "type": err_type,
            "message": message if message is not None else default_message,
        },
        "request_id": request_id if request_id is not None else _request_id(),
    }


def error_response(
    status: int, message: str | None = None, headers: Mapping[str, str] = _JSON_HEADERS
) -> web.Response:
    request_id = _request_id()
    merged = {**_JSON_HEADERS, "request-id": request_id, **headers}
    if status in (204, 304):
        return web.Response(status=status, headers=merged)
    return web.Response(
        status=status, body=orjson.dumps(error_body(status, message, request_id)), headers=merged
    )


def _invalid(ex: Exchange, message: str) -> web.Response:
    request_id = _request_id()
    return web.Response(
        status=400,
        body=orjson.dumps(error_body(400, message, request_id)),
        headers=ex.response_headers({**_JSON_HEADERS, "request-id": request_id}),
    )


def _validate(body: Any) -> str | None:
    """The API's message for an invalid request body, None when it is fine."""
    if not isinstance(body, dict):
        return "There was an issue with your request body: it must be a JSON object."
    model = body.get("model")
    if model is None:
        return "model: Field required"
    if not isinstance(model, str) or not model:
        return "model: Input should be a valid string"
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        return "max_tokens: Field required"
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return "max_tokens: Input should be a valid integer"
    if max_tokens < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    messages = body.get("messages")
    if messages is None:
        return "messages: Field required"
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    return None


def _block_texts(content: Any) -> list[str]:
    """Every text in a content (string or blocks), tool_result contents included."""
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
            elif block.get("type") == "tool_result":
                texts.extend(_block_texts(block.get("content")))
    return texts


def _input_tokens(body: Mapping[str, Any], messages: Sequence[Any]) -> int:
    """Rough prompt size: words of the system prompt and of every message."""
    total = sum(count_words(t) for t in _block_texts(body.get("system")))
    for message in messages:
        if isinstance(message, dict):
            total += sum(count_words(t) for t in _block_texts(message.get("content")))
    return total


def _tool_results(messages: Sequence[Any]) -> list[str] | None:
    """Contents of the tool_result blocks of a final user message, else None."""
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    if not isinstance(content, list):
        return None
    results = [
        content_text(block.get("content"))
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    return results or None


def _tool_to_call(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The tool a request with ``tools`` gets a call of, or None."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = body.get("tool_choice")
    named: Any = None
    if isinstance(choice, dict):
        if choice.get("type") == "none":
            return None
        if choice.get("type") == "tool":
            named = choice.get("name")
    candidates = [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
    for tool in candidates:
        if tool["name"] == named:
            return tool
    return candidates[0] if candidates else None


@attrs.frozen
class _Answer:
    """What the fake "generates": text tokens or one tool call, and why it stopped.

    Before them, optionally (``Fault.redacted_thinking``, ``Fault.thinking``)
    a redacted_thinking block and a signed thinking block, in that order.
    """

    tokens: Sequence[str]  # text pieces, or the tool input's JSON fragments
    stop_reason: str
    tool_id: str | None = None
    tool_name: str | None = None
    tool_input: Mapping[str, Any] | None = None
    thinking: Sequence[str] | None = None  # the thinking block's pieces
    redacted_thinking: str | None = None
    signature: str = ""

    @property
    def output_tokens(self) -> int:
        return len(self.tokens) + len(self.thinking or ())

    def reasoning(self) -> list[dict[str, Any]]:
        """The thinking blocks that open the content (none unless the Fault asks)."""
        blocks: list[dict[str, Any]] = []
        if self.redacted_thinking is not None:
            blocks.append({"type": "redacted_thinking", "data": self.redacted_thinking})
        if self.thinking is not None:
            thought = "".join(self.thinking)
            blocks.append({"type": "thinking", "thinking": thought, "signature": self.signature})
        return blocks

    def content(self) -> list[dict[str, Any]]:
        blocks = self.reasoning()
        if self.tool_name is not None:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": self.tool_id,
                    "name": self.tool_name,
                    "input": self.tool_input,
                }
            )
        elif self.tokens:
            blocks.append({"type": "text", "text": "".join(self.tokens)})
        # The API sends no text block at all when nothing visible was generated.
        return blocks


def _plan(body: Mapping[str, Any], messages: Sequence[Any], model: str, ex: Exchange) -> _Answer:
    answer = _plan_visible(body, messages, model, ex)
    fault = ex.fault
    if fault.thinking is None and fault.redacted_thinking is None:
        return answer
    return attrs.evolve(
        answer,
        thinking=None if fault.thinking is None else split_tokens(fault.thinking),
        redacted_thinking=fault.redacted_thinking,
        # Opaque to clients, like the API's: base64 of bytes that mean nothing.
        signature=base64.b64encode(os.urandom(48)).decode(),
    )


def _plan_visible(
    body: Mapping[str, Any], messages: Sequence[Any], model: str, ex: Exchange
) -> _Answer:
    fault = ex.fault
    if fault.empty_length:
        # max_tokens reached before any visible text: content [] (not an empty
        # text block), stop_reason "max_tokens", as api.anthropic.com does.
        return _Answer((), "max_tokens")
    text = fault.text
    if text is None:
        results = _tool_results(messages)
        if results is not None:
            text = tool_result_answer(results)
        else:
            tool = _tool_to_call(body)
            if tool is not None:
                arguments = tool_arguments(tool.get("input_schema"))
                _json_text, fragments = tool_arguments_json(arguments)
                return _Answer(
                    fragments,
                    "tool_use",
                    tool_id="toolu_" + os.urandom(12).hex(),
                    tool_name=tool["name"],
                    tool_input=arguments,
                )
            text = default_answer(model)
    tokens = split_tokens(text)
    max_tokens: int = body["max_tokens"]
    if max_tokens < len(tokens):
        return _Answer(tokens[:max_tokens], "max_tokens")
    return _Answer(tokens, "end_turn")


def _event(name: str, payload: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"


_PING = _event("ping", {"type": "ping"})
# What an empty Fault.stream_error ({}) sends: the API's mid-stream overload.
_OVERLOADED_EVENT = _event(
    "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)
_BLOCK_STOP = _event("content_block_stop", {"type": "content_block_stop", "index": 0})
_MESSAGE_STOP = _event("message_stop", {"type": "message_stop"})
_TEXT_DELTA_HEAD = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
)
_JSON_DELTA_HEAD = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"input_json_delta","partial_json":'
)
_THINKING_DELTA_HEAD = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"thinking_delta","thinking":'
)
_DELTA_TAIL = b"}}\n\n"


def _stream_error_event(error: Mapping[str, Any]) -> bytes:
    # {} means the default overload; a full {"type": "error", "error": {...}}
    # or a wrapped {"error": {...}} is sent as is; anything else is the inner
    # error object.
    if not error:
        return _OVERLOADED_EVENT
    if "error" in error:
        return _event("error", {"type": "error", **error})
    return _event("error", {"type": "error", "error": error})


def _at(index: int, head: bytes) -> bytes:
    """A delta head (written for block 0) for the block at ``index``."""
    return head if index == 0 else head.replace(b'"index":0,', b'"index":%d,' % index, 1)


def _block_start(index: int, block: Mapping[str, Any]) -> bytes:
    payload = {"type": "content_block_start", "index": index, "content_block": block}
    return _event("content_block_start", payload)


def _block_stop(index: int) -> bytes:
    if index == 0:
        return _BLOCK_STOP
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})


async def _stream_message(
    ex: Exchange, message: Mapping[str, Any], answer: _Answer, headers: Mapping[str, str]
) -> web.StreamResponse:
    usage = message["usage"]
    start_usage = {**usage, "output_tokens": 1}
    delta_usage = {"output_tokens": usage["output_tokens"]}
    override = ex.fault.usage
    if override:
        # See Fault.usage: each event lies only about what it reports, and a
        # made-up key goes where a client reads the final numbers.
        for key, value in override.items():
            if key in start_usage:
                start_usage[key] = value
            if key in delta_usage or key not in start_usage:
                delta_usage[key] = value
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    opening = [_event("message_start", {"type": "message_start", "message": start})]
    pieces: list[bytes] = []

    def between(*events: bytes) -> None:
        # A block's boundary events go with the piece before them (the opening
        # before any): a stream cut after K pieces ends inside a block.
        if pieces:
            pieces[-1] += b"".join(events)
        else:
            opening.extend(events)

    index = 0
    if answer.redacted_thinking is not None:
        # The API sends a redacted block whole in its start event: no deltas.
        redacted = {"type": "redacted_thinking", "data": answer.redacted_thinking}
        between(_block_start(index, redacted), _block_stop(index))
        index += 1
    if answer.thinking is not None:
        between(_block_start(index, {"type": "thinking", "thinking": "", "signature": ""}))
        head = _at(index, _THINKING_DELTA_HEAD)
        pieces.extend(head + orjson.dumps(token) + _DELTA_TAIL for token in answer.thinking)
        signature = {"type": "signature_delta", "signature": answer.signature}
        between(
            _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": signature},
            ),
            _block_stop(index),
        )
        index += 1
    has_block = bool(answer.tokens) or answer.tool_name is not None
    if answer.tool_name is not None:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": answer.tool_id,
            "name": answer.tool_name,
            "input": {},
        }
        delta_head = _at(index, _JSON_DELTA_HEAD)
    else:
        block = {"type": "text", "text": ""}
        delta_head = _at(index, _TEXT_DELTA_HEAD)
    if has_block:
        between(_block_start(index, block))
    # The API pings right after the first block starts (or the message, without one).
    opening.insert(2 if len(opening) > 1 else 1, _PING)
    pieces.extend(delta_head + orjson.dumps(token) + _DELTA_TAIL for token in answer.tokens)
    closing = [_block_stop(index)] if has_block else []
    closing.append(
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": answer.stop_reason, "stop_sequence": None},
                "usage": delta_usage,
            },
        )
    )
    closing.append(_MESSAGE_STOP)
    return await stream_answer(
        ex,
        headers,
        b"".join(opening),
        pieces,
        b"".join(closing),
        _stream_error_event,
    )


async def _messages(ex: Exchange) -> web.StreamResponse:
    problem = _validate(ex.body)
    if problem is not None:
        return _invalid(ex, problem)
    body: dict[str, Any] = ex.body
    model: str = body["model"]
    messages: list[Any] = body["messages"]

    fault = ex.fault
    if fault.context_limit is not None:
        prompt = _input_tokens(body, messages)
        if prompt > fault.context_limit:
            # The API's own words for a prompt longer than the context window.
            return _invalid(
                ex, f"prompt is too long: {prompt} tokens > {fault.context_limit} maximum"
            )
    stream = body.get("stream") is True
    if fault.die_after_chunks is not None and not stream:
        return ex.hang_up()

    answer = _plan(body, messages, model, ex)
    usage: dict[str, Any] = {
        "input_tokens": _input_tokens(body, messages),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": answer.output_tokens,
    }
    if fault.usage and not stream:
        # A stream spreads usage over two events; _stream_message applies it there.
        usage.update(fault.usage)
    message = {
        "id": "msg_" + os.urandom(12).hex(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": answer.content(),
        "stop_reason": answer.stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }

    if stream:
        return await _stream_message(
            ex, message, answer, {**_SSE_HEADERS, "request-id": _request_id()}
        )

    # A real upstream takes as long to answer as it takes to generate.
    pause = fault.first_token_delay_s + fault.token_delay_s * max(answer.output_tokens - 1, 0)
    await ex.pause(pause)
    return web.Response(
        body=json_bytes(message),
        headers=ex.response_headers({**_JSON_HEADERS, "request-id": _request_id()}),
    )


async def _count_tokens(ex: Exchange) -> web.StreamResponse:
    """``POST /v1/messages/count_tokens``: the body of a Messages request without
    ``max_tokens``; the answer is ``{"input_tokens": N}``, as the messages answer counts."""
    body = ex.body
    problem = _validate({**body, "max_tokens": 1} if isinstance(body, dict) else body)
    if problem is not None:
        return _invalid(ex, problem)
    if "max_tokens" in body or "stream" in body:
        key = "max_tokens" if "max_tokens" in body else "stream"
        return _invalid(ex, f"{key}: Extra inputs are not permitted")
    return web.Response(
        body=json_bytes({"input_tokens": _input_tokens(body, body["messages"])}),
        headers=ex.response_headers({**_JSON_HEADERS, "request-id": _request_id()}),
    )


def anthropic_wire() -> WireFormat:
    """The Anthropic Messages wire format (POST /v1/messages, /v1/messages/count_tokens)."""
    return WireFormat(
        name="anthropic",
        routes=(
            Route("POST", "messages", _messages),
            Route("POST", "messages/count_tokens", _count_tokens),
        ),
        error_response=error_response,
    )
