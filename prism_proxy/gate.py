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
from typing import Any

from .call import Call, Endpoint
from .catalog import LINE_CAPABILITIES, Binding
from .wire import wire_for

__all__ = ["CAPABILITIES", "Incompatible", "check_line", "prompt_tokens", "used_capabilities"]

CAPABILITIES = LINE_CAPABILITIES

_VISION_PARTS = frozenset({"image_url", "image", "document", "file"})
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
    if isinstance(response_format, dict) and response_format.get("type") in (
        "json_object",
        "json_schema",
    ):
        found.add("json_mode")
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
    messages = body.get("messages")
    if isinstance(messages, list):
        return [m for m in messages if isinstance(m, dict)]
    return ()


def _parts(content: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(content, list):
        return [part for part in content if isinstance(part, dict)]
    return ()
