"""Before dispatch: can this binding express this request, and in which body?

A request in one wire format may be served by a provider speaking another:
the body is translated, and whatever the target API cannot express makes
the binding skipped for this request, with the reason in the attempt record.
"""

from __future__ import annotations

from typing import Any

import attrs

from .call import Call, Endpoint
from .catalog import Binding
from .providers import Provider
from .wire import Wire, wire_for, wire_named
from .wire.translate_request import Untranslatable, anthropic_to_openai, openai_to_anthropic
from .wire.translate_response import (
    AnthropicToOpenAIStream,
    OpenAIToAnthropicStream,
    StreamTranslator,
    anthropic_to_openai_body,
    openai_to_anthropic_body,
)

__all__ = ["Prepared", "Untranslatable", "prepare"]

# The endpoint a provider must serve natively to answer a caller's endpoint.
_NATIVE = {
    (Endpoint.CHAT, "anthropic"): Endpoint.MESSAGES,
    (Endpoint.MESSAGES, "openai"): Endpoint.CHAT,
}


@attrs.frozen
class Prepared:
    """The request as one binding's provider will receive it."""

    endpoint: Endpoint
    body: dict[str, Any]
    adjusted: tuple[str, ...]
    client_wire: Wire
    provider_wire: Wire

    @property
    def translated(self) -> bool:
        return self.client_wire is not self.provider_wire

    def stream_translator(self, include_usage: bool) -> StreamTranslator | None:
        if not self.translated:
            return None
        if self.client_wire.name == "anthropic":
            return OpenAIToAnthropicStream()
        return AnthropicToOpenAIStream(include_usage=include_usage)

    def translate_body(self, payload: Any) -> Any:
        """A whole non-streaming answer in the caller's format."""
        if not self.translated or not isinstance(payload, dict):
            return payload
        usage = self.provider_wire.usage_update(None, payload)
        if self.client_wire.name == "anthropic":
            return openai_to_anthropic_body(payload, usage)
        return anthropic_to_openai_body(payload, usage)


def prepare(call: Call, binding: Binding, provider: Provider) -> Prepared:
    """Translate and normalise ``call.body`` for ``binding``; raises Untranslatable."""
    client_wire = wire_for(call.endpoint)
    provider_wire = wire_named(provider.wire)
    endpoint = _NATIVE.get((call.endpoint, provider.wire), call.endpoint)
    if endpoint not in provider.endpoints:
        raise Untranslatable(f"provider kind {provider.spec.kind!r} has no {call.endpoint} API")
    adjusted: list[str] = []
    if client_wire is provider_wire:
        body = dict(call.body)
    elif provider.wire == "anthropic":
        body, adjusted = openai_to_anthropic(call.body, provider.default_max_tokens)
    else:
        body, adjusted = anthropic_to_openai(call.body)
    adjusted.extend(provider.adjust(binding, body))
    return Prepared(endpoint, body, tuple(adjusted), client_wire, provider_wire)
