"""OpenAI's Responses API (``POST /v1/responses``): whole Response objects and typed events.

The answer follows the chat completion's rules (the Fault's ``text``, else
the model's greeting; ``tools`` get a call of the first, or the named, tool
unless ``tool_choice`` is ``"none"``; input ending in ``function_call_output``
items is answered with text; ``max_output_tokens`` cuts the answer, which is
then ``incomplete``; a ``context_limit`` refuses a longer input with
``context_length_exceeded``).  A request with a ``reasoning`` object is answered by a
reasoning model: a ``reasoning`` item comes first, with an opaque
``encrypted_content`` that this fake alone can read back; an input reasoning
item whose ``encrypted_content`` it did not make is refused as OpenAI refuses
it (400 ``invalid_encrypted_content``).  The fake keeps no state:
``previous_response_id`` is always unknown to it (400).

Streams are the typed events the openai SDK reads, each with its
``sequence_number``: ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` … ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete``); no ``[DONE]``.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

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
from .exchange import Exchange, json_bytes, stream_answer

__all__ = ["responses"]

_JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})
_SSE_HEADERS: Mapping[str, str] = MappingProxyType(
    {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
)
#: What the fake's encrypted reasoning says, base64-encoded (it checks it on the way back).
_SEALED = b"fake-reasoning:"


def _error(ex: Exchange, message: str, param: str | None, code: str | None) -> web.Response:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return web.Response(
        status=400, body=orjson.dumps(body), headers=ex.response_headers(_JSON_HEADERS)
    )


def _items(body: Mapping[str, Any]) -> list[Any]:
    inputs = body.get("input")
    if isinstance(inputs, str):
        return [{"type": "message", "role": "user", "content": inputs}]
    return list(inputs) if isinstance(inputs, list) else []


def _prompt_words(body: Mapping[str, Any], items: Sequence[Any]) -> int:
    instructions = body.get("instructions")
    total = count_words(instructions) if isinstance(instructions, str) else 0
    for item in items:
        if isinstance(item, dict):
            for key in ("content", "output", "arguments"):
                total += count_words(content_text(item.get(key)))
    return total


def _bad_reasoning(items: Sequence[Any]) -> str | None:
    """The id of an input reasoning item whose encrypted content this fake did not make."""
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        sealed = item.get("encrypted_content")
        if sealed is None:
            continue
        try:
            valid = isinstance(sealed, str) and base64.b64decode(sealed).startswith(_SEALED)
        except ValueError:
            valid = False
        if not valid:
            return str(item.get("id"))
    return None


def _tool_call(body: Mapping[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or choice == "none":
        return None
    named = choice.get("name") if isinstance(choice, dict) else None
    functions = [
        tool
        for tool in tools
        if isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(tool.get("name"), str)
    ]
    if not functions:
        return None
    chosen = next((tool for tool in functions if tool["name"] == named), functions[0])
    arguments, fragments = tool_arguments_json(tool_arguments(chosen.get("parameters")))
    call_id = "call_" + os.urandom(12).hex()
    return {
        "id": "fc_" + os.urandom(12).hex(),
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": chosen["name"],
        "arguments": arguments,
        "fragments": fragments,
    }


def _reasoning_item() -> dict[str, Any]:
    item_id = "rs_" + os.urandom(12).hex()
    sealed = base64.b64encode(_SEALED + item_id.encode() + os.urandom(8)).decode()
    return {"id": item_id, "type": "reasoning", "summary": [], "encrypted_content": sealed}


def _usage(prompt: int, output: int, reasoning: int, override: Any) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output + reasoning,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output + reasoning,
    }
    if override:
        usage.update(override)
    return usage


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _response(
    body: Mapping[str, Any], response_id: str, created: int, status: str
) -> dict[str, Any]:
    """The Response object without its output and usage (the request's parameters echoed)."""
    text = body.get("text") if isinstance(body.get("text"), dict) else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model"),
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": text or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


class _Events:
    """Typed events, numbered as they are made."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"


async def responses(ex: Exchange) -> web.StreamResponse:
    body = ex.body
    if not isinstance(body, dict):
        return _error(ex, "We could not parse the JSON body of your request.", None, None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _error(
            ex, "Missing required parameter: 'model'.", "model", "missing_required_parameter"
        )
    if body.get("previous_response_id") is not None:
        return _error(
            ex,
            f"Previous response with id '{body['previous_response_id']}' not found.",
            "previous_response_id",
            "previous_response_not_found",
        )
    items = _items(body)
    if not items:
        return _error(ex, "Missing required parameter: 'input'.", "input", None)
    bad = _bad_reasoning(items)
    if bad is not None:
        return _error(
            ex,
            f"The encrypted content for item {bad} could not be verified.",
            None,
            "invalid_encrypted_content",
        )
    fault = ex.fault
    prompt = _prompt_words(body, items)
    if fault.context_limit is not None and prompt > fault.context_limit:
        message = (
            f"Your input exceeds the context window of this model ({fault.context_limit} "
            f"tokens; the input has {prompt}). Please adjust your input and try again."
        )
        return _error(ex, message, "input", "context_length_exceeded")
    stream = body.get("stream") is True
    if fault.die_after_chunks is not None and not stream:
        return ex.hang_up()

    output: list[dict[str, Any]] = []
    if isinstance(body.get("reasoning"), dict):
        output.append(_reasoning_item())
    call = None
    text = fault.text
    last = items[-1]
    if text is None and isinstance(last, dict) and last.get("type") == "function_call_output":
        results = [
            content_text(item.get("output"))
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        text = tool_result_answer(results[-1:])
    elif text is None and "tools" in body:
        call = _tool_call(body)
    status, reason = "completed", None
    tokens: list[str] = []
    if fault.empty_length:
        status, reason = "incomplete", "max_output_tokens"
    elif call is not None:
        tokens = call.pop("fragments")
    else:
        tokens = split_tokens(text if text is not None else default_answer(model))
        limit = body.get("max_output_tokens")
        if isinstance(limit, int) and 0 < limit < len(tokens):
            tokens = tokens[:limit]
            status, reason = "incomplete", "max_output_tokens"
    reasoning = 2 if output else 0
    usage = _usage(prompt, len(tokens), reasoning, fault.usage)
    response_id = "resp_" + os.urandom(12).hex()
    created = int(time.time())
    message_id = "msg_" + os.urandom(12).hex()
    if call is not None:
        output.append(call)
    elif tokens or status == "completed":
        item_status = "completed" if status == "completed" else "incomplete"
        output.append(
            {
                "id": message_id,
                "type": "message",
                "status": item_status,
                "role": "assistant",
                "content": [_text_part("".join(tokens))],
            }
        )
    final = _response(body, response_id, created, status)
    final["output"] = output
    final["usage"] = usage
    if reason is not None:
        final["incomplete_details"] = {"reason": reason}
    if not stream:
        await ex.pause(fault.first_token_delay_s + fault.token_delay_s * max(len(tokens) - 1, 0))
        return web.Response(body=json_bytes(final), headers=ex.response_headers(_JSON_HEADERS))
    return await _stream(ex, body, final, tokens)


async def _stream(
    ex: Exchange, body: Mapping[str, Any], final: dict[str, Any], tokens: Sequence[str]
) -> web.StreamResponse:
    event = _Events()
    opening_response = _response(body, final["id"], final["created_at"], "in_progress")
    opening = [
        event("response.created", response=opening_response),
        event("response.in_progress", response=opening_response),
    ]
    pieces: list[bytes] = []
    closing: list[bytes] = []
    for index, item in enumerate(final["output"]):
        kind = item["type"]
        if kind == "reasoning":
            opening.append(event("response.output_item.added", output_index=index, item=item))
            opening.append(event("response.output_item.done", output_index=index, item=item))
        elif kind == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            opening.append(event("response.output_item.added", output_index=index, item=added))
            for fragment in tokens:
                pieces.append(
                    event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=fragment,
                    )
                )
            closing.append(
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            closing.append(event("response.output_item.done", output_index=index, item=item))
        else:
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            added = {**item, "status": "in_progress", "content": []}
            opening.append(event("response.output_item.added", output_index=index, item=added))
            opening.append(event("response.content_part.added", **common, part=_text_part("")))
            for token in tokens:
                pieces.append(
                    event("response.output_text.delta", **common, delta=token, logprobs=[])
                )
            part = item["content"][0]
            closing.append(
                event("response.output_text.done", **common, text=part["text"], logprobs=[])
            )
            closing.append(event("response.content_part.done", **common, part=part))
            closing.append(event("response.output_item.done", output_index=index, item=item))
    done = "response.completed" if final["status"] == "completed" else "response.incomplete"
    closing.append(event(done, response=final))

    def error_event(error: Mapping[str, Any]) -> bytes:
        inner = error.get("error", error)
        return event(
            "error",
            code=inner.get("code"),
            message=inner.get("message", "The server had an error."),
            param=inner.get("param"),
        )

    return await stream_answer(
        ex, _SSE_HEADERS, b"".join(opening), pieces, b"".join(closing), error_event
    )
