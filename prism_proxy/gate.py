"""Before dispatch: can a chain line take this request at all (capabilities, context size)?

A line may declare what it can do (``capabilities = ["tools", "vision",
"json_mode", "audio"]``) and how large a prompt it takes
(``max_context_tokens``).  A request that uses a capability skips lines that
declare capabilities without it; a prompt whose estimated size exceeds a
line's context skips it.  A line that declares nothing is not gated: the
operator has not said.  What a request uses is worked out once per call,
and only when some line asks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .call import Call, Endpoint
from .catalog import LINE_CAPABILITIES, Binding
from .wire import wire_for

__all__ = [
    "CAPABILITIES",
    "Incompatible",
    "check_line",
    "check_signed",
    "prompt_tokens",
    "reasoning_signer",
    "used_capabilities",
]

CAPABILITIES = LINE_CAPABILITIES

_VISION_PARTS = frozenset({"image_url", "image", "document", "file", "input_image"})
_JSON_FORMATS = ("json_object", "json_schema")
#: Responses API input items that are a tool round trip.
_TOOL_ITEMS = frozenset({"function_call", "function_call_output"})
_AUDIO_PARTS = frozenset({"input_audio"})
_TOOL_PARTS = frozenset({"tool_use", "tool_result"})


class Incompatible(Exception):
    """The line cannot take this request; the message is the reason, as recorded."""


def check_line(call: Call, binding: Binding) -> None:
    """Raise :class:`Incompatible` when ``binding`` cannot take ``call``."""
    options = binding.options
    declared = options.get("capabilities")
    if declared is not None:
        missing = [name for name in used_capabilities(call) if name not in declared]
        if missing:
            raise Incompatible(f"lacks {', '.join(missing)}")
    context = options.get("max_context_tokens")
    if context is not None:
        prompt = prompt_tokens(call)
        if prompt > context:
            raise Incompatible(f"prompt ~{prompt} tokens > max_context_tokens {context}")


#: The provider family each wire's signed reasoning comes from, and goes back to:
#: OpenAI's encrypted reasoning items are read by OpenAI lines (chat or Responses),
#: Anthropic's thinking signatures by Anthropic lines.  A wire a plugin brings is
#: its own family.
_FAMILIES = {"openai": "openai", "responses": "openai", "anthropic": "anthropic"}
_MESSAGES_ENDPOINT, _RESPONSES_ENDPOINT = Endpoint.MESSAGES, Endpoint.RESPONSES


def reasoning_signer(call: Call) -> str:
    """The provider family that signed reasoning in the conversation's history ("": none).

    Anthropic ``thinking`` blocks with a ``signature`` and ``redacted_thinking``
    blocks, in assistant turns of a Messages call; Responses ``reasoning``
    items with ``encrypted_content``.  Chat carries none.  Looked for only when
    a line of another wire than the caller's is considered.
    """
    body = call.body
    if call.endpoint is _MESSAGES_ENDPOINT:
        for message in _messages(body):
            if message.get("role") != "assistant":
                continue
            for block in _parts(message.get("content")):
                kind = block.get("type")
                if kind == "redacted_thinking" or (kind == "thinking" and block.get("signature")):
                    return "anthropic"
    elif call.endpoint is _RESPONSES_ENDPOINT:
        items = body.get("input")
        if isinstance(items, list):
            for item in items:
                if (
                    isinstance(item, dict)
                    and item.get("type") == "reasoning"
                    and item.get("encrypted_content")
                ):
                    return "openai"
    return ""


def check_signed(signer: str, provider_wire: str) -> None:
    """Raise :class:`Incompatible` when a line speaking ``provider_wire`` cannot verify it."""
    family = _FAMILIES.get(provider_wire, provider_wire)
    if family != signer:
        raise Incompatible(f"signed_reasoning: the history carries reasoning signed by {signer}")


def used_capabilities(call: Call) -> tuple[str, ...]:
    """The capabilities the request needs, in :data:`CAPABILITIES` order (cached on the call)."""
    used = call.capabilities
    if used is None:
        used = call.capabilities = _capabilities(call.endpoint, call.body)
    return used


def prompt_tokens(call: Call) -> int:
    """Prism's estimate of the prompt's tokens (worked out once per call, then cached on it)."""
    tokens = call.prompt_tokens
    if tokens is None:
        estimate = wire_for(call.endpoint).estimate_usage(call.body, 0)
        tokens = call.prompt_tokens = estimate.input_tokens
    return tokens


def _capabilities(endpoint: Endpoint, body: Mapping[str, Any]) -> tuple[str, ...]:
    found: set[str] = set()
    if body.get("tools") or body.get("functions"):
        found.add("tools")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in _JSON_FORMATS:
        found.add("json_mode")
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and text_format.get("type") in _JSON_FORMATS:
        found.add("json_mode")  # the Responses API's response_format
    modalities = body.get("modalities")
    if body.get("audio") or (isinstance(modalities, list) and "audio" in modalities):
        found.add("audio")
    for message in _messages(body):
        if message.get("role") == "tool" or message.get("tool_calls"):
            found.add("tools")
        for part in _parts(message.get("content")):
            kind = part.get("type")
            if kind in _VISION_PARTS:
                found.add("vision")
            elif kind in _AUDIO_PARTS:
                found.add("audio")
            elif kind in _TOOL_PARTS:
                found.add("tools")
    return tuple(name for name in CAPABILITIES if name in found)


def _messages(body: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """Chat's and Messages' ``messages``, or the Responses API's ``input`` items.

    A function call or its output is read as a message with a tool part, so
    it needs ``tools`` as a chat tool message does.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        return [m for m in messages if isinstance(m, dict)]
    items = body.get("input")
    if isinstance(items, list):
        return [_TOOL_MESSAGE if item.get("type") in _TOOL_ITEMS else item
                for item in items if isinstance(item, dict)]  # fmt: skip
    return ()


_TOOL_MESSAGE: Mapping[str, Any] = MappingProxyType({"role": "tool"})


def _parts(content: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(content, list):
        return [part for part in content if isinstance(part, dict)]
    return ()
