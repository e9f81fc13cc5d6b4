"""Before dispatch: can this binding express this request, and in which body?

A request in one wire format may be served by a provider speaking another:
the generation's :class:`~prism_proxy.wire.Wires` registry names the
translation, the body is translated, and whatever the target API cannot
express makes the binding skipped for this request, with the reason in the
attempt record.  A provider that speaks the caller's wire natively beside its
own (``Provider.native_wires``) is sent the request in it, through the
wire's same-wire :class:`~prism_proxy.wire.Translation` (what the gateway
keeps of the request for itself, and the answer's own id and echo).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    #: How the answer goes back to the caller's wire (None: the same wire, as it is).
    translation: Translation | None = None
    #: The provider speaks the caller's wire natively (``Provider.native_wires``).
    native: bool = False
    #: The request's parameters the answer repeats (``Wire.echo``; empty: none).
    echo: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def translated(self) -> bool:
        """The answer is rebuilt on its way back (translated, or a native wire's own)."""
        return self.translation is not None

    @property
    def sent_as(self) -> str | None:
        """How the line got the call, for the attempt record (None: as the caller sent it)."""
        if self.native:
            return f"native {self.provider_wire.name}"
        if self.translation is not None:
            return f"translated to {self.provider_wire.name}"
        return None

    def stream_translator(self, include_usage: bool) -> StreamTranslator | None:
        if self.translation is None:
            return None
        translator: StreamTranslator = self.translation.stream(include_usage)
        if self.echo:
            # Through a chain of translators too: the caller's side takes the echo.
            translator.repeat(self.echo)
        return translator

    def translate_body(self, payload: Any) -> Any:
        """A whole non-streaming answer in the caller's format."""
        if self.translation is None or not isinstance(payload, dict):
            return payload
        answer = self.translation.body(payload, self.provider_wire.usage_update(None, payload))
        if self.echo:
            answer.update(self.echo)
        return answer


def prepare(call: Call, binding: Binding, provider: Provider, wires: Wires) -> Prepared:
    """Translate and normalise ``call.body`` for ``binding``; raises Untranslatable."""
    client_wire = wire_for(call.endpoint)
    echo = client_wire.echo(call.body) if client_wire.echo is not None else {}
    if provider.native_wires.get(call.endpoint) == client_wire.name:
        return _native(call, binding, provider, wires, client_wire, echo)
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
    return Prepared(
        endpoint, body, tuple(adjusted), client_wire, provider_wire, translation, echo=echo
    )


def _native(
    call: Call,
    binding: Binding,
    provider: Provider,
    wires: Wires,
    wire: Wire,
    echo: Mapping[str, Any],
) -> Prepared:
    """The request in the caller's own wire, for a provider that speaks it natively."""
    # Looked up as it is, never chained through another wire: this is no translation.
    own = wires.translations.get((wire.name, wire.name))
    if own is None:
        body: dict[str, Any] = dict(call.body)
        adjusted: list[str] = []
    else:
        body, adjusted = own.request(call.body, provider)
    adjusted.extend(provider.adjust(binding, body))
    return Prepared(call.endpoint, body, tuple(adjusted), wire, wire, own, native=True, echo=echo)
