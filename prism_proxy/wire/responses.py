"""The OpenAI Responses API (``POST /v1/responses``) as callers speak it.

A request is checked here.  A line that speaks the Responses API natively
gets it as it is (:func:`native_request`: reasoning items and all, with
``store: false``, since the gateway keeps the conversation); any other is
sent it translated onto the Chat Completions body (:func:`responses_to_chat`),
which an OpenAI line takes as it is and an Anthropic line through the chat
translation (reasoning items dropped).  So a Responses call goes through the
dispatch, failover, billing and headers of any chat call, and whatever a line
cannot express skips it exactly as a chat request would (``Untranslatable``).

``previous_response_id`` is resolved before dispatch
(``prism_proxy.responses_endpoints``): the stored conversation's items are
put in front of ``input``, so a line only ever sees whole conversations.
Every Response the gateway answers repeats the request's parameters
(:func:`repeated`), as OpenAI's do.

What the gateway cannot serve at all (built-in tools, ``conversation``
objects, background mode, prompt templates …) is the caller's 400 before dispatch,
naming the field, with code ``unsupported_parameter``, ``unsupported_tool``
or ``unsupported_input``.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..call import Endpoint, Usage
from ..errors import PrismError, echo
from .chat_parts import estimated_usage, text_chars
from .events import ChunkKind
from .openai import error_body
from .shape import bad, member

__all__ = [
    "DONE_EVENT",
    "error_body",
    "estimate_usage",
    "native_request",
    "repeated",
    "responses_to_chat",
    "validate_responses",
]

#: A Responses stream has no end marker of its own: ``response.completed``
#: (written by the translator before the call settles) is its last event.
DONE_EVENT = b""

_STR: tuple[type, ...] = (str,)
_DICT: tuple[type, ...] = (dict,)
_NUMBER = ((int, float), "a number")

#: Top-level fields taken, with their types and how an error names them.
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "model": (_STR, "a string"),
    "input": ((str, list), "a string or an array of input items"),
    "instructions": (_STR, "a string"),
    "stream": ((bool,), "true or false"),
    "store": ((bool,), "true or false"),
    "max_output_tokens": ((int,), "a whole number"),
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "tools": ((list,), "an array"),
    "tool_choice": ((str, dict), "a string or an object"),
    "parallel_tool_calls": ((bool,), "true or false"),
    "text": (_DICT, "an object"),
    "metadata": (_DICT, "an object"),
    "user": (_STR, "a string"),
    "reasoning": (_DICT, "an object"),
    "stream_options": (_DICT, "an object"),
    "prompt_cache_key": (_STR, "a string"),
    "safety_identifier": (_STR, "a string"),
    "service_tier": (_STR, "a string"),
    "truncation": (_STR, "a string"),
    "include": ((list,), "an array"),
    "background": ((bool,), "true or false"),
    "previous_response_id": (_STR, "a string"),
}

#: Fields Prism does not serve (yet), with what they are: refused when set.
_UNSUPPORTED = {
    "conversation": "conversations are not kept",
    "prompt": "stored prompt templates are not available",
    "top_logprobs": "logprobs are not available on the Responses endpoint",
    "max_tool_calls": "max_tool_calls applies to built-in tools, which are not available",
    "context_management": "server-side context management is not available",
}

#: What a native line is asked to include so that reasoning survives ``store: false``.
ENCRYPTED_REASONING = "reasoning.encrypted_content"

_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TOOL_CHOICES = frozenset({"auto", "none", "required"})
_FORMATS = frozenset({"text", "json_object", "json_schema"})


def _unsupported(param: str, message: str, code: str = "unsupported_parameter") -> PrismError:
    return bad(code, message, param)


def validate_responses(body: dict[str, Any]) -> tuple[str, bool]:
    """Check a Responses API request; returns (model, stream)."""
    for key in body:
        if key in _UNSUPPORTED:
            if body[key] is not None:
                raise _unsupported(key, f"'{key}' is not supported by Prism: {_UNSUPPORTED[key]}")
            continue
        field = _FIELDS.get(key)
        if field is None:
            name = echo(key)
            raise _unsupported(name, f"'{name}' is not a Responses API parameter Prism takes")
        types, what = field
        member(body, key, "", types, what)
    model = member(body, "model", "", _STR, "a non-empty string", required=True)
    if not model:
        raise bad("invalid_type", "'model' must be a non-empty string", "model")
    inputs = member(body, "input", "", (str, list), "a string or an array", required=True)
    if isinstance(inputs, list):
        if not inputs:
            raise bad("invalid_value", "'input' must contain at least one item", "input")
        for index, item in enumerate(inputs):
            _check_item(item, f"input[{index}]")
    if body.get("background"):
        raise _unsupported("background", "'background' responses are not supported by Prism")
    for index, name in enumerate(body.get("include") or ()):
        if name != ENCRYPTED_REASONING:
            raise _unsupported(
                f"include[{index}]",
                f"'include' may only name '{ENCRYPTED_REASONING}' on Prism "
                "(built-in tools, logprobs and files are not available)",
            )
    if body.get("truncation") not in (None, "disabled"):
        raise _unsupported(
            "truncation", "'truncation' must be 'disabled' (Prism truncates nothing)"
        )
    limit = body.get("max_output_tokens")
    if limit is not None and limit < 1:
        raise bad("invalid_value", "'max_output_tokens' must be at least 1", "max_output_tokens")
    for index, tool in enumerate(body.get("tools") or ()):
        _check_tool(tool, f"tools[{index}]")
    _check_tool_choice(body.get("tool_choice"))
    text = body.get("text")
    if text is not None:
        _check_text(text)
    reasoning = body.get("reasoning")
    if reasoning is not None:
        member(reasoning, "effort", "reasoning", _STR, "a string")
    return model, bool(body.get("stream"))


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad("invalid_type", f"'{where}' must be an object", where)
    return value


def _check_item(item: Any, where: str) -> None:
    _object(item, where)
    kind = member(item, "type", where, _STR, "a string")
    if kind in (None, "message"):
        role = member(item, "role", where, _STR, "a string", required=True)
        if role not in _ROLES:
            raise bad(
                "invalid_value",
                f"'{where}.role' must be one of {', '.join(sorted(_ROLES))}",
                f"{where}.role",
            )
        content = member(
            item, "content", where, (str, list), "a string or an array of parts", required=True
        )
        if isinstance(content, list):
            for index, part in enumerate(content):
                _check_part(part, role, f"{where}.content[{index}]")
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            member(item, key, where, _STR, "a string", required=True)
    elif kind == "function_call_output":
        member(item, "call_id", where, _STR, "a string", required=True)
        output = member(
            item, "output", where, (str, list), "a string or an array of parts", required=True
        )
        if isinstance(output, list):
            for index, part in enumerate(output):
                at = f"{where}.output[{index}]"
                if member(_object(part, at), "type", at, _STR, "a string") != "input_text":
                    raise _unsupported(
                        f"{at}.type",
                        f"'{at}.type' must be 'input_text' (Prism passes on text tool output)",
                        "unsupported_input",
                    )
                member(part, "text", at, _STR, "a string", required=True)
    elif kind != "reasoning":
        raise _unsupported(
            f"{where}.type",
            f"input items of type '{echo(kind)}' are not supported by Prism (it takes "
            "messages, function_call, function_call_output and reasoning items)",
            "unsupported_input",
        )


def _check_part(part: Any, role: str, where: str) -> None:
    _object(part, where)
    kind = member(part, "type", where, _STR, "a string", required=True)
    if kind in ("input_text", "output_text"):
        member(part, "text", where, _STR, "a string", required=True)
    elif kind == "refusal":
        member(part, "refusal", where, _STR, "a string", required=True)
    elif kind == "input_image" and role == "user":
        if member(part, "image_url", where, _STR, "a string") is None:
            raise _unsupported(
                f"{where}.image_url",
                f"'{where}' needs an 'image_url' (a URL or a data URL): Prism keeps no files",
                "unsupported_input",
            )
        member(part, "detail", where, _STR, "a string")
    else:
        raise _unsupported(
            f"{where}.type",
            f"content parts of type '{echo(kind)}' are not supported in a {role} message",
            "unsupported_input",
        )


def _check_tool(tool: Any, where: str) -> None:
    _object(tool, where)
    kind = member(tool, "type", where, _STR, "a string", required=True)
    if kind != "function":
        raise _unsupported(
            f"{where}.type",
            f"built-in tool '{echo(kind)}' is not supported by Prism (only function tools)",
            "unsupported_tool",
        )
    member(tool, "name", where, _STR, "a string", required=True)
    member(tool, "description", where, _STR, "a string")
    member(tool, "parameters", where, _DICT, "an object (a JSON Schema)")
    member(tool, "strict", where, (bool,), "true or false")


def _check_tool_choice(choice: Any) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise bad(
                "invalid_value",
                "'tool_choice' must be 'auto', 'none', 'required' or a function",
                "tool_choice",
            )
        return
    kind = member(choice, "type", "tool_choice", _STR, "a string", required=True)
    if kind != "function":
        raise _unsupported(
            "tool_choice.type",
            f"tool_choice of type '{echo(kind)}' is not supported by Prism (only 'function')",
            "unsupported_tool",
        )
    member(choice, "name", "tool_choice", _STR, "a string", required=True)


def _check_text(text: dict[str, Any]) -> None:
    fmt = member(text, "format", "text", _DICT, "an object")
    member(text, "verbosity", "text", _STR, "a string")
    if fmt is None:
        return
    kind = member(fmt, "type", "text.format", _STR, "a string", required=True)
    if kind not in _FORMATS:
        raise bad(
            "invalid_value",
            "'text.format.type' must be 'text', 'json_object' or 'json_schema'",
            "text.format.type",
        )
    if kind == "json_schema":
        member(fmt, "name", "text.format", _STR, "a string", required=True)
        member(fmt, "schema", "text.format", _DICT, "an object (a JSON Schema)", required=True)
        member(fmt, "strict", "text.format", (bool,), "true or false")
        member(fmt, "description", "text.format", _STR, "a string")


# -- onto the Chat Completions body -------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or part.get("refusal") or "" for part in content)


def _user_parts(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part["type"] == "input_image":
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            parts.append({"type": "text", "text": part.get("text", "")})
    return parts


def _messages(body: dict[str, Any], adjusted: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    inputs = body["input"]
    if isinstance(inputs, str):
        messages.append({"role": "user", "content": inputs})
        return messages
    for item in inputs:
        kind = item.get("type")
        if kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            # Calls made in one turn travel in one assistant message, after its text.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": _text_of(item["output"]),
                }
            )
        elif kind == "reasoning":
            if "dropped reasoning items" not in adjusted:
                adjusted.append("dropped reasoning items")
        else:
            role = item["role"]
            content = item["content"]
            if role == "user":
                messages.append({"role": "user", "content": _user_parts(content)})
            else:
                messages.append({"role": role, "content": _text_of(content)})
    return messages


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": fmt["name"], "schema": fmt["schema"]}
    for key in ("strict", "description"):
        if fmt.get(key) is not None:
            schema[key] = fmt[key]
    return {"type": "json_schema", "json_schema": schema}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"]}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


#: Fields carried over to the chat body under the same name.
_SAME = ("temperature", "top_p", "user", "parallel_tool_calls", "prompt_cache_key",
         "safety_identifier", "service_tier")  # fmt: skip


def responses_to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The checked Responses request as a Chat Completions body, and what was adjusted.

    ``metadata``, ``store`` and ``previous_response_id`` stay with Prism (the
    conversation was put into ``input`` before this).
    """
    adjusted: list[str] = []
    out: dict[str, Any] = {"model": body["model"], "messages": _messages(body, adjusted)}
    for key in _SAME:
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(tool) for tool in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        out["tool_choice"] = choice
    text = body.get("text") or {}
    if text.get("format") is not None:
        response_format = _response_format(text["format"])
        if response_format is not None:
            out["response_format"] = response_format
    if text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]
    reasoning = body.get("reasoning") or {}
    if reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    if reasoning.get("summary") is not None:
        adjusted.append("dropped reasoning.summary")
    return out, adjusted


# -- natively, and what every answer repeats ----------------------------------------


def native_request(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The request for a line that speaks the Responses API: as the caller sent it, but
    ``store: false`` and without ``previous_response_id``.

    The gateway keeps conversations itself (the id is its own, unknown upstream,
    and the items are already in ``input``), so the upstream keeps nothing; a
    request that asks for ``reasoning`` also asks for the reasoning's encrypted
    content, the only form in which reasoning goes on without upstream state.
    """
    out = dict(body)
    out.pop("previous_response_id", None)
    out["store"] = False
    if out.get("reasoning") is not None:
        include = list(out.get("include") or ())
        if ENCRYPTED_REASONING not in include:
            out["include"] = [*include, ENCRYPTED_REASONING]
    return out, []


def repeated(body: dict[str, Any]) -> dict[str, Any]:
    """The request's parameters a Response repeats, with OpenAI's defaults for those unset.

    ``model`` is not among them: the answer names the line's model, as
    OpenAI's names the snapshot that served it.
    """
    text = body.get("text")
    reasoning = body.get("reasoning")
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None, **(reasoning or {})},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}, **(text or {})},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
    }


# -- the wire's own functions --------------------------------------------------------
# Used when Prism answers a Responses caller itself (errors, estimates) and to
# read the events of a line that speaks the Responses API natively.

_CONTENT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.completed",
        "response.incomplete",
    }
)


def event_kind(data: bytes) -> tuple[ChunkKind, Any]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ChunkKind.INVALID, None
    if not isinstance(payload, dict):
        return ChunkKind.ERROR, payload
    kind = payload.get("type")
    if kind in ("error", "response.failed"):
        return ChunkKind.ERROR, payload
    return (ChunkKind.CONTENT if kind in _CONTENT_EVENTS else ChunkKind.PRELUDE), payload


def usage_of(response: Any) -> Usage | None:
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    inputs = usage.get("input_tokens_details") or {}
    outputs = usage.get("output_tokens_details") or {}
    try:
        return Usage(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cached_input_tokens=int(inputs.get("cached_tokens") or 0),
            reasoning_tokens=int(outputs.get("reasoning_tokens") or 0),
        )
    except (TypeError, ValueError):
        return Usage(suspect=True)


def usage_update(previous: Usage | None, payload: Any) -> Usage | None:
    if isinstance(payload, dict) and isinstance(payload.get("response"), dict):
        return usage_of(payload["response"]) or previous
    return usage_of(payload) or previous


def digest(payload: Any) -> tuple[int, str | None]:
    kind = payload.get("type")
    if kind in ("response.completed", "response.incomplete"):
        return 0, finish_reason(payload.get("response"))
    delta = payload.get("delta")
    return (len(delta) if isinstance(delta, str) else 0), None


def answer_problem(endpoint: Endpoint, payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return "200 without a JSON answer"
    if not isinstance(payload.get("output"), list):
        return None if "error" in payload else "answer without output"
    return None


def answer_chars(payload: Any) -> int:
    total = 0
    for item in payload.get("output") or ():
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("arguments"), str):
            total += len(item["arguments"])
        for part in item.get("content") or ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
    return total


def finish_reason(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    if payload.get("status") == "incomplete":
        reason = (payload.get("incomplete_details") or {}).get("reason")
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")[:32]
    return "stop" if payload.get("status") == "completed" else None


def estimate_usage(body: dict[str, Any], delivered_chars: int) -> Usage:
    """About four characters a token, over the instructions and every text in the input."""
    chars = len(body.get("instructions") or "")
    inputs = body.get("input")
    if isinstance(inputs, str):
        chars += len(inputs)
    for item in inputs if isinstance(inputs, list) else ():
        if not isinstance(item, dict):
            continue
        for key in ("content", "output", "arguments"):
            value = item.get(key)
            if isinstance(value, str):
                chars += len(value)
            elif isinstance(value, list):
                chars += text_chars(value)
    return estimated_usage(chars, delivered_chars)


def error_payload(err: PrismError, sequence_number: int) -> dict[str, Any]:
    """The stream's ``error`` event: the code, message and field, flat."""
    return {
        "type": "error",
        "code": err.code,
        "message": err.message,
        "param": err.param,
        "sequence_number": sequence_number,
    }


def error_event(err: PrismError) -> bytes:
    """An ``error`` event for a stream whose translator is not at hand (its number unknown)."""
    return b"event: error\ndata: " + orjson.dumps(error_payload(err, 0)) + b"\n\n"
