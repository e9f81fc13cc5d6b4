"""Translating requests between the OpenAI chat and Anthropic Messages formats.

Each translator returns the translated body and the list of adjustments it
made (parameters dropped because they cannot change the answer, such as a
cache hint), or raises :class:`Untranslatable` naming the feature the target
API lacks, so the binding is skipped before dispatch and the record says why.
Nothing that changes the answer is ever dropped silently.

The body has passed its wire's validation (``validate_chat``,
``validate_messages``): every member read here is of the type the API
defines (``wire.shape``), so a translator never meets one it cannot handle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from .chat_parts import (
    CHAT_CARRIED,
    OPENAI_ONLY_UNSEEDED,
    Untranslatable,
    chat_tool_call,
    chat_turns,
    check_chat_params,
    data_url,
    system_text,
    tool_arguments,
)

__all__ = ["ANSWER_TOOL", "Untranslatable", "anthropic_to_openai", "openai_to_anthropic"]

#: The tool a structured output (``response_format``) becomes on an Anthropic
#: line: forced, its input is the answer (``translate_response`` turns it back
#: into the message's text).
ANSWER_TOOL = "json_answer"
_ANSWER_DESCRIPTION = (
    "Give your whole answer by calling this tool: its input is the answer, "
    "a JSON object that matches the schema."
)
_STRUCTURED = ("json_object", "json_schema")

# OpenAI parameters with no Anthropic equivalent that change the answer.
_OPENAI_ONLY = OPENAI_ONLY_UNSEEDED
# OpenAI parameters the translation carries over (or checks and refuses
# below); usage always comes with an Anthropic stream, so include_usage
# (``stream_options``) is honoured.
_OPENAI_CARRIED = CHAT_CARRIED | {"user", "parallel_tool_calls"}
# Anthropic parameters the translation carries over (or refuses).
_ANTHROPIC_HANDLED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "temperature",
        "top_p",
        "stop_sequences",
        "stream",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "top_k",
        "container",
        "mcp_servers",
    }
)


def _unhandled(body: dict[str, Any], handled: frozenset[str]) -> list[str]:
    """Everything else is dropped, and said so: nothing leaves the request silently."""
    return [f"dropped {key}" for key in body if key not in handled and body[key] is not None]


def _image_source(url: str) -> dict[str, Any]:
    image = data_url(url)
    if image is None:
        return {"type": "url", "url": url}
    return {"type": "base64", "media_type": image.media_type or "image/png", "data": image.data}


def _openai_parts_to_blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            blocks.append({"type": "image", "source": _image_source(str(image.get("url", "")))})
        else:
            raise Untranslatable(f"content part type {kind!r}")
    return blocks


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks = _openai_parts_to_blocks(message.get("content"))
    for call in message.get("tool_calls") or ():
        arguments = tool_arguments(call)
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": arguments,
            }
        )
    return blocks


def _tool_result_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    result["content"] = content if isinstance(content, str) else _openai_parts_to_blocks(content)
    return [result]


def openai_to_anthropic(
    body: dict[str, Any], default_max_tokens: int
) -> tuple[dict[str, Any], list[str]]:
    adjusted: list[str] = []
    dropped = check_chat_params(body, unsupported=_OPENAI_ONLY, carried=_OPENAI_CARRIED)
    response_format = body.get("response_format")
    format_kind = response_format.get("type") if response_format else None
    if format_kind not in (None, "text", *_STRUCTURED):
        raise Untranslatable(f"response_format {format_kind}")

    system = system_text(body)
    messages = chat_turns(
        body,
        user=lambda message: _openai_parts_to_blocks(message.get("content")),
        assistant=_assistant_blocks,
        tool=_tool_result_blocks,
    )
    out: dict[str, Any] = {"model": body["model"], "messages": messages}
    if system is not None:
        out["system"] = system
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        adjusted.append(f"max_tokens defaulted to {default_max_tokens}")
        max_tokens = default_max_tokens
    out["max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if temperature is not None:
        if temperature > 1:
            raise Untranslatable("temperature above 1")
        out["temperature"] = temperature
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("stream"):
        out["stream"] = True
    if body.get("user"):
        out["metadata"] = {"user_id": body["user"]}
    tools = body.get("tools")
    if tools:
        out["tools"] = []
        for tool in tools:
            if tool.get("type") != "function":
                raise Untranslatable(f"tool type {tool.get('type')!r}")
            function = tool.get("function") or {}
            converted = {
                "name": function.get("name"),
                "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
            }
            if function.get("description"):
                converted["description"] = function["description"]
            out["tools"].append(converted)
    choice = _anthropic_tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    if format_kind in _STRUCTURED:
        assert response_format is not None
        _answer_tool(out, body, response_format, adjusted)
    adjusted.extend(dropped)
    return out, adjusted


def _answer_schema(response_format: dict[str, Any]) -> dict[str, Any]:
    """The schema a structured output must match (json_object: any object)."""
    if response_format["type"] == "json_object":
        return {"type": "object"}
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise Untranslatable("response_format json_schema without a schema object")
    # A tool's input is an object: OpenAI asks the same of a structured output's root.
    if schema.get("type") != "object":
        raise Untranslatable("response_format json_schema whose root is not an object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        raise Untranslatable("response_format json_schema that is no JSON Schema") from None
    return schema


def _answer_tool(
    out: dict[str, Any], body: dict[str, Any], response_format: dict[str, Any], adjusted: list[str]
) -> None:
    """``response_format`` as Anthropic can express it: a forced tool whose input is the answer.

    With tools of the caller's that the model may call (``tool_choice``
    auto), it must call one of them or give the answer (``any``); a
    ``tool_choice`` that forces a call leaves no answer in this turn to shape.
    """
    caller_tools = out.get("tools") or []
    if any(tool.get("name") == ANSWER_TOOL for tool in caller_tools):
        raise Untranslatable(f"a tool named {ANSWER_TOOL} alongside response_format")
    schema = _answer_schema(response_format)
    choice = body.get("tool_choice")
    if caller_tools and choice not in (None, "auto", "none"):
        return
    tool: dict[str, Any] = {
        "name": ANSWER_TOOL,
        "description": _ANSWER_DESCRIPTION,
        "input_schema": schema,
    }
    out["tools"] = [*caller_tools, tool]
    if caller_tools and choice != "none":
        out["tool_choice"] = {"type": "any"}
        if body.get("parallel_tool_calls") is False:
            out["tool_choice"]["disable_parallel_tool_use"] = True
    else:
        out["tool_choice"] = {"type": "tool", "name": ANSWER_TOOL}
    adjusted.append(f"response_format {response_format['type']} as a forced tool")


def _anthropic_tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None and parallel is not False:
        return None
    if choice in (None, "auto"):
        out: dict[str, Any] = {"type": "auto"}
    elif choice == "none":
        out = {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        out = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    else:
        raise Untranslatable(f"tool_choice {choice!r}")
    if parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def _anthropic_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or ())


def _cache_hint(block: dict[str, Any], adjusted: list[str]) -> None:
    if "cache_control" in block and "dropped cache_control" not in adjusted:
        adjusted.append("dropped cache_control")


def _openai_user_parts(blocks: list[dict[str, Any]], adjusted: list[str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        _cache_hint(block, adjusted)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            source = block.get("source") or {}
            if source.get("type") == "base64":
                url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            elif source.get("type") == "url":
                url = str(source.get("url"))
            else:
                raise Untranslatable(f"image source {source.get('type')!r}")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise Untranslatable(f"content block type {kind!r}")
    return parts


def _tool_result_text(content: Any, adjusted: list[str]) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for block in content or ():
        _cache_hint(block, adjusted)
        if block.get("type") != "text":
            raise Untranslatable(f"tool result block type {block.get('type')!r}")
        texts.append(block.get("text", ""))
    return "\n".join(texts)


def anthropic_to_openai(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    adjusted: list[str] = []
    for key, feature in (
        ("thinking", "extended thinking"),
        ("top_k", "top_k"),
        ("container", "containers"),
        ("mcp_servers", "MCP servers"),
    ):
        if body.get(key) is not None:
            raise Untranslatable(feature)
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        blocks = _anthropic_blocks(system)
        for block in blocks:
            _cache_hint(block, adjusted)
        messages.append({"role": "system", "content": "\n".join(b.get("text", "") for b in blocks)})
    for message in body["messages"]:
        blocks = _anthropic_blocks(message.get("content"))
        if message.get("role") == "assistant":
            texts, calls = [], []
            for block in blocks:
                _cache_hint(block, adjusted)
                kind = block.get("type")
                if kind == "text":
                    texts.append(block.get("text", ""))
                elif kind == "tool_use":
                    calls.append(
                        chat_tool_call(block.get("id"), block.get("name"), block.get("input") or {})
                    )
                else:
                    raise Untranslatable(f"assistant content block type {kind!r}")
            out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
            continue
        # Tool results answer the previous assistant turn, so they come first.
        results = [b for b in blocks if b.get("type") == "tool_result"]
        others = [b for b in blocks if b.get("type") != "tool_result"]
        for result in results:
            _cache_hint(result, adjusted)
            if result.get("is_error"):
                adjusted.append("tool error flag folded into the tool message")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": result.get("tool_use_id"),
                    "content": _tool_result_text(result.get("content"), adjusted),
                }
            )
        if others:
            messages.append({"role": "user", "content": _openai_user_parts(others, adjusted)})

    out_body: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body["max_tokens"],
    }
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out_body[key] = body[key]
    stop = body.get("stop_sequences")
    if stop:
        if len(stop) > 4:
            raise Untranslatable("more than 4 stop sequences")
        out_body["stop"] = list(stop)
    if body.get("stream"):
        out_body["stream"] = True
    user = (body.get("metadata") or {}).get("user_id")
    if user:
        out_body["user"] = user
    tools = body.get("tools")
    if tools:
        out_body["tools"] = []
        for tool in tools:
            if tool.get("type") not in (None, "custom"):
                raise Untranslatable(f"server tool {tool.get('type')!r}")
            _cache_hint(tool, adjusted)
            function: dict[str, Any] = {
                "name": tool.get("name"),
                "parameters": tool.get("input_schema") or {},
            }
            if tool.get("description"):
                function["description"] = tool["description"]
            out_body["tools"].append({"type": "function", "function": function})
    choice = body.get("tool_choice")
    if choice:
        kind = choice.get("type")
        mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            mapped = {"type": "function", "function": {"name": choice.get("name")}}
        if mapped is None:
            raise Untranslatable(f"tool_choice {kind!r}")
        out_body["tool_choice"] = mapped
        if choice.get("disable_parallel_tool_use"):
            out_body["parallel_tool_calls"] = False
    adjusted.extend(_unhandled(body, _ANTHROPIC_HANDLED))
    return out_body, adjusted
