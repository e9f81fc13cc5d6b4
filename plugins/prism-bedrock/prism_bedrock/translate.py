"""OpenAI chat completions to Bedrock Converse, and the answer back.

Callers of the other wires (Anthropic Messages, Responses) reach a Bedrock
line through chat: the core composes their translation to chat with this one.
Whatever Converse cannot express raises ``Untranslatable`` naming it, so the
line is skipped before dispatch and the attempt record says why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prism_proxy import (
    CHAT_CARRIED,
    OPENAI_ONLY_UNSEEDED,
    ChatChunks,
    ChunkKind,
    Endpoint,
    StreamTranslatorBase,
    Translation,
    Untranslatable,
    Usage,
    chat_completion,
    chat_tool_call,
    chat_turns,
    check_chat_params,
    data_url,
    system_text,
    tool_arguments,
    tool_result_text,
)

from .wire import event_name

__all__ = ["FROM_OPENAI", "ConverseToChatStream", "chat_to_converse", "converse_to_chat_body"]

#: Image formats Converse takes, by media type.
_IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
_TO_OPENAI_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}


def _image(url: str) -> dict[str, Any]:
    image = data_url(url, remote="an image by URL (Converse takes image bytes only)")
    image_format = _IMAGE_FORMATS.get(image.media_type)
    if image_format is None:
        raise Untranslatable(f"image type {image.media_type or 'unknown'!r}")
    # The REST wire carries a blob as base64 text: the caller's own goes as it is
    # (never decoded here; Bedrock refuses bad data as a ValidationException).
    return {"image": {"format": image_format, "source": {"bytes": image.data}}}


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            if part.get("text"):
                blocks.append({"text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image(str((part.get("image_url") or {}).get("url", ""))))
        else:
            raise Untranslatable(f"content part type {kind!r}")
    return blocks


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    arguments = tool_arguments(call)
    name = (call.get("function") or {}).get("name")
    return {"toolUse": {"toolUseId": call.get("id"), "name": name, "input": arguments}}


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks = _blocks(message.get("content"))
    blocks.extend(_tool_use(call) for call in message.get("tool_calls") or ())
    return blocks


def _tool_result(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    text = tool_result_text(message.get("content"))
    result = {"toolUseId": message.get("tool_call_id"), "content": [{"text": text}]}
    return [{"toolResult": result}]


def _has_tool_blocks(messages: list[dict[str, Any]]) -> bool:
    return any(
        "toolUse" in block or "toolResult" in block
        for message in messages
        for block in message["content"]
    )


def _tool_config(
    body: dict[str, Any], messages: list[dict[str, Any]], adjusted: list[str]
) -> dict[str, Any] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools:
        return None
    if choice == "none":
        # Converse has no "none": tools not offered cannot be called, but a
        # conversation with tool blocks must declare its tools.
        if _has_tool_blocks(messages):
            raise Untranslatable("tool_choice 'none' in a conversation with tool calls")
        adjusted.append("tools left out for tool_choice none")
        return None
    specs = []
    for tool in tools:
        if tool.get("type") != "function":
            raise Untranslatable(f"tool type {tool.get('type')!r}")
        function = tool.get("function") or {}
        spec: dict[str, Any] = {
            "name": function.get("name"),
            "inputSchema": {
                "json": function.get("parameters") or {"type": "object", "properties": {}}
            },
        }
        if function.get("description"):
            spec["description"] = function["description"]
        specs.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": specs}
    if choice in (None, "auto"):
        pass
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        config["toolChoice"] = {"tool": {"name": (choice.get("function") or {}).get("name")}}
    else:
        raise Untranslatable(f"tool_choice {choice!r}")
    return config


def chat_to_converse(body: dict[str, Any], provider: Any) -> tuple[dict[str, Any], list[str]]:
    """A chat completions request as a Converse request (``stream`` kept as the send mode)."""
    dropped = check_chat_params(body, unsupported=OPENAI_ONLY_UNSEEDED, carried=CHAT_CARRIED)
    response_format = body.get("response_format")
    if response_format and response_format.get("type") not in (None, "text"):
        raise Untranslatable(f"response_format {response_format.get('type')}")

    system = system_text(body)
    messages = chat_turns(
        body,
        user=lambda message: _blocks(message.get("content")),
        assistant=_assistant_blocks,
        tool=_tool_result,
    )

    out: dict[str, Any] = {"messages": messages}
    if system:
        # Converse takes no empty text block: an empty system prompt is none.
        out["system"] = [{"text": system}]
    inference: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        inference["maxTokens"] = max_tokens
    if body.get("temperature") is not None:
        inference["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        inference["topP"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        inference["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if inference:
        out["inferenceConfig"] = inference
    adjusted: list[str] = []
    config = _tool_config(body, messages, adjusted)
    if config is not None:
        out["toolConfig"] = config
    if body.get("stream"):
        out["stream"] = True
    adjusted += dropped
    return out, adjusted


def _finish(reason: Any) -> str:
    return _TO_OPENAI_FINISH.get(reason if isinstance(reason, str) else "", "stop")


def converse_to_chat_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    texts, calls = [], []
    for block in payload["output"]["message"]["content"]:
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            tool = block["toolUse"]
            calls.append(
                chat_tool_call(tool.get("toolUseId"), tool.get("name"), tool.get("input", {}))
            )
    return chat_completion(
        completion_id="chatcmpl-bedrock-" + str(time.time_ns()),
        # Set by the provider: Converse names no model in its answer.
        model=payload.get("modelId"),
        texts=texts,
        tool_calls=calls,
        finish_reason=_finish(payload.get("stopReason")),
        usage=usage,
    )


class ConverseToChatStream(StreamTranslatorBase):
    """ConverseStream events in, OpenAI chat chunks out."""

    def __init__(self, *, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.chunks = ChatChunks("chatcmpl-bedrock-" + str(time.time_ns()))
        #: Converse content block index -> OpenAI tool call position.
        self.tools: dict[int, int] = {}

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        named = event_name(payload)
        if named is None or not isinstance(named[1], dict):
            return []
        name, event = named
        index = event.get("contentBlockIndex", 0)
        if name == "messageStart":
            if isinstance(event.get("modelId"), str):
                self.chunks.model = event["modelId"]
            return [self.chunks.delta({"role": "assistant", "content": ""})]
        if name == "contentBlockStart":
            tool = (event.get("start") or {}).get("toolUse")
            if not isinstance(tool, dict):
                return []
            position = self.tools[index] = len(self.tools)
            call = {
                "index": position,
                "id": tool.get("toolUseId"),
                "type": "function",
                "function": {"name": tool.get("name"), "arguments": ""},
            }
            return [self.chunks.delta({"tool_calls": [call]})]
        if name == "contentBlockDelta":
            delta = event.get("delta") or {}
            if isinstance(delta.get("text"), str) and delta["text"]:
                return [self.chunks.delta({"content": delta["text"]})]
            tool = delta.get("toolUse")
            if isinstance(tool, dict) and tool.get("input"):
                position = self.tools.get(index, 0)
                call = {"index": position, "function": {"arguments": tool["input"]}}
                return [self.chunks.delta({"tool_calls": [call]})]
            return []
        if name == "messageStop":
            return [self.chunks.delta({}, _finish(event.get("stopReason")))]
        return []

    def finish(self, usage: Usage | None) -> list[bytes]:
        if not self.include_usage or usage is None:
            return []
        return [self.chunks.usage(usage)]


FROM_OPENAI = Translation(
    client="openai",
    provider="bedrock",
    endpoints={Endpoint.CHAT: Endpoint.CHAT},
    request=chat_to_converse,
    body=converse_to_chat_body,
    stream=lambda include_usage: ConverseToChatStream(include_usage=include_usage),
)
