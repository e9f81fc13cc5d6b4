"""Before dispatch: can this binding express this request, and in which body?

A request in one wire format may be served by a provider speaking another:
the generation's :class:`~prism_proxy.wire.Wires` registry names the
translation, the body is translated, and whatever the target API cannot
express makes the binding skipped for this request, with the reason in the
attempt record.
"""

from __future__ import annotations

from typing import Any

import attrs

from .call import Call, Endpoint
from .catalog import Binding
from .providers import Provider
from .wire import Translation, Wire, Wires, wire_for
from .wire.translate_request import Untranslatable
from .wire.translate_response import StreamTranslator

__all__ = ["Prepared", "Untranslatable", "prepare"]


@attrs.frozen
class Prepared:
    """The request as one binding's provider will receive it."""

    endpoint: Endpoint
    body: dict[str, Any]
    adjusted: tuple[str, ...]
    client_wire: Wire
    provider_wire: Wire
    #: How the answer goes back to the caller's wire (None: the same wire).
    translation: Translation | None = None

    @property
    def translated(self) -> bool:
        return self.translation is not None

    def stream_translator(self, include_usage: bool) -> StreamTranslator | None:
        if self.translation is None:
            return None
        translator: StreamTranslator = self.translation.stream(include_usage)
        return translator

    def translate_body(self, payload: Any) -> Any:
        """A whole non-streaming answer in the caller's format."""
        if self.translation is None or not isinstance(payload, dict):
            return payload
        return self.translation.body(payload, self.provider_wire.usage_update(None, payload))


def prepare(call: Call, binding: Binding, provider: Provider, wires: Wires) -> Prepared:
    """Translate and normalise ``call.body`` for ``binding``; raises Untranslatable."""
    client_wire = wire_for(call.endpoint)
    provider_wire = wires.get(provider.wire)
    if provider_wire is None:
        raise Untranslatable(f"no plugin provides the {provider.wire!r} wire format")
    translation = None
    endpoint = call.endpoint
    if provider_wire is not client_wire:
        translation = wires.translation(client_wire, provider_wire)
        if translation is None or call.endpoint not in translation.endpoints:
            raise Untranslatable(f"provider kind {provider.spec.kind!r} has no {call.endpoint} API")
        endpoint = translation.endpoints[call.endpoint]
    if endpoint not in provider.endpoints:
        raise Untranslatable(f"provider kind {provider.spec.kind!r} has no {call.endpoint} API")
    adjusted: list[str] = []
    if translation is None:
        body = dict(call.body)
    else:
        body, adjusted = translation.request(call.body, provider)
    adjusted.extend(provider.adjust(binding, body))
    return Prepared(endpoint, body, tuple(adjusted), client_wire, provider_wire, translation)
