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

from typing import Any

import orjson

from .openai import tool_use_to_call
from .shape import MAX_DEPTH, deeper_than

__all__ = ["Untranslatable", "anthropic_to_openai", "openai_to_anthropic"]


class Untranslatable(Exception):
    """The request uses a feature the target API cannot express."""


# OpenAI parameters with no Anthropic equivalent that change the answer.
_OPENAI_ONLY = {
    "logprobs": "logprobs",
    "top_logprobs": "logprobs",
    "logit_bias": "logit_bias",
    "audio": "audio output",
    "prediction": "predicted outputs",
    "seed": "seed",
    "functions": "legacy functions",
    "function_call": "legacy function_call",
    "web_search_options": "web search",
    "reasoning_effort": "reasoning_effort",
}
# OpenAI parameters the translation carries over (or checks and refuses above).
_OPENAI_HANDLED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "response_format",
        "modalities",
        # Usage always comes with an Anthropic stream: include_usage is honoured.
        "stream_options",
        *_OPENAI_ONLY,
    }
)
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
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        media_type = header[5:].split(";")[0] or "image/png"
        if ";base64" not in header:
            raise Untranslatable("a non-base64 data URL image")
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


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


def _system_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or ():
        if part["type"] != "text":
            raise Untranslatable(f"system content part type {part['type']!r}")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_input(call: dict[str, Any]) -> Any:
    """A tool call's arguments (a JSON text) as the object Anthropic's ``input`` is."""
    if call.get("type") not in (None, "function"):
        raise Untranslatable(f"tool call type {call['type']!r}")
    try:
        arguments = orjson.loads(call["function"]["arguments"] or "{}")
    except orjson.JSONDecodeError:
        raise Untranslatable("tool call arguments that are not JSON") from None
    if not isinstance(arguments, dict):
        raise Untranslatable("tool call arguments that are not a JSON object")
    # The text was never counted in the body's depth: parsed, it nests in it.
    if deeper_than(arguments, MAX_DEPTH):
        raise Untranslatable(f"tool call arguments nested more than {MAX_DEPTH} levels deep")
    return arguments


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Anthropic wants alternating turns: consecutive same-role messages merge."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def openai_to_anthropic(
    body: dict[str, Any], default_max_tokens: int
) -> tuple[dict[str, Any], list[str]]:
    adjusted: list[str] = []
    for key, feature in _OPENAI_ONLY.items():
        if body.get(key) not in (None, False):
            raise Untranslatable(feature)
    if (body.get("n") or 1) > 1:
        raise Untranslatable("n > 1")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key):
            raise Untranslatable(key)
    response_format = body.get("response_format")
    if response_format and response_format.get("type") != "text":
        raise Untranslatable(f"response_format {response_format.get('type')}")
    if "audio" in (body.get("modalities") or ()):
        raise Untranslatable("audio output")

    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in body["messages"]:
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system.append(_system_text(content))
        elif role == "user":
            _append(messages, "user", _openai_parts_to_blocks(content))
        elif role == "assistant":
            blocks = _openai_parts_to_blocks(content)
            for call in message.get("tool_calls") or ():
                arguments = _tool_input(call)
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": arguments,
                    }
                )
            _append(messages, "assistant", blocks)
        elif role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
            }
            result["content"] = (
                content if isinstance(content, str) else _openai_parts_to_blocks(content)
            )
            _append(messages, "user", [result])
        else:
            raise Untranslatable(f"message role {role!r}")

    out: dict[str, Any] = {"model": body["model"], "messages": messages}
    if system:
        out["system"] = "\n\n".join(system)
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
    adjusted.extend(_unhandled(body, _OPENAI_HANDLED))
    return out, adjusted


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
                    calls.append(tool_use_to_call(block))
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
