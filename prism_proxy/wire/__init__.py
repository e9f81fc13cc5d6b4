"""Wire formats: what the core knows of each API it speaks to callers and upstreams.

A :class:`Wire` owns its stream inspection, usage accounting, error body,
done and error events and the degraded answer; a :class:`Translation` turns
a caller's request in one wire into another wire's and the answer back.  The
core asks the generation's :class:`Wires` registry for both and never
compares wire names.  ``prism_wires`` lets a provider plugin ship its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ..call import Endpoint, Usage
from ..errors import PrismError
from . import anthropic, openai
from .events import ChunkKind
from .translate_request import anthropic_to_openai, openai_to_anthropic
from .translate_response import (
    AnthropicToOpenAIStream,
    OpenAIToAnthropicStream,
    anthropic_to_openai_body,
    openai_to_anthropic_body,
)

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "ChunkKind",
    "Translation",
    "Wire",
    "Wires",
    "default_wires",
    "wire_for",
]


@attrs.frozen
class Wire:
    """One wire format's stream inspection, usage accounting and error shapes."""

    name: str
    inspect: Callable[[bytes], tuple[ChunkKind, Any]]
    usage_update: Callable[[Usage | None, Any], Usage | None]
    #: For a content event: (characters of answer text, the finish reason when it
    #: finishes the answer, else None).
    digest: Callable[[Any], tuple[int, str | None]]
    #: Of consecutive events' data, how many lead that a relay forwarding them as
    #: they are need not parse (choices and no usage), their
    #: characters of text, the finish reason the last of them gave, and the index
    #: of the first that carries content, the commit point (-1: none does).
    plain_run: Callable[[list[bytes]], tuple[int, int, str | None, int]]
    estimate_usage: Callable[[dict[str, Any], int], Usage]
    #: Why a 200 body is not an answer of the endpoint (None: it is one, or it is an error).
    answer_problem: Callable[[Endpoint, Any], str | None]
    #: Characters of answer text in a whole answer that passed ``answer_problem``.
    answer_chars: Callable[[Any], int]
    #: Why a whole answer stopped (``stop``, ``length``, ``end_turn``…), as the upstream said.
    finish_reason: Callable[[Any], str | None]
    error_body: Callable[[PrismError], bytes]
    error_event: Callable[[PrismError], bytes]
    #: The final event of a stream, written after the call is settled.
    done_event: bytes
    #: The operator's degraded answer as this wire's whole answer: (id suffix, model, text).
    degraded_body: Callable[[str, str, str], dict[str, Any]]
    #: The same answer as a complete stream, final event included.
    degraded_events: Callable[[str, str, str], bytes]


@attrs.frozen
class Translation:
    """How a caller speaking ``client`` is served by an upstream speaking ``provider``.

    ``endpoints`` maps the caller's endpoint to the one the provider must
    serve natively; ``request`` turns the caller's body into the provider's
    (returning what it adjusted, or raising ``Untranslatable``), ``body``
    turns a whole answer back, and ``stream`` makes a stream translator.
    """

    client: str
    provider: str
    endpoints: Mapping[Endpoint, Endpoint]
    request: Callable[[dict[str, Any], Any], tuple[dict[str, Any], list[str]]]
    body: Callable[[dict[str, Any], Usage | None], dict[str, Any]]
    stream: Callable[[bool], Any]


OPENAI = Wire(
    name="openai",
    inspect=openai.chunk_kind,
    usage_update=openai.usage_update,
    digest=openai.digest,
    finish_reason=openai.finish_reason,
    plain_run=openai.plain_run,
    estimate_usage=openai.estimate_usage,
    answer_problem=openai.answer_problem,
    answer_chars=openai.answer_chars,
    error_body=openai.error_body,
    error_event=openai.error_event,
    done_event=openai.DONE_EVENT,
    degraded_body=openai.degraded_body,
    degraded_events=openai.degraded_events,
)

ANTHROPIC = Wire(
    name="anthropic",
    inspect=anthropic.event_kind,
    usage_update=anthropic.usage_update,
    digest=anthropic.digest,
    finish_reason=anthropic.finish_reason,
    plain_run=lambda datas: (0, 0, None, -1),
    estimate_usage=anthropic.estimate_usage,
    answer_problem=anthropic.answer_problem,
    answer_chars=anthropic.answer_chars,
    error_body=anthropic.error_body,
    error_event=anthropic.error_event,
    done_event=anthropic.DONE_EVENT,
    degraded_body=anthropic.degraded_body,
    degraded_events=anthropic.degraded_events,
)

TRANSLATIONS = (
    Translation(
        client="openai",
        provider="anthropic",
        endpoints={Endpoint.CHAT: Endpoint.MESSAGES},
        request=lambda body, provider: openai_to_anthropic(body, provider.default_max_tokens),
        body=anthropic_to_openai_body,
        stream=lambda include_usage: AnthropicToOpenAIStream(include_usage=include_usage),
    ),
    Translation(
        client="anthropic",
        provider="openai",
        endpoints={Endpoint.MESSAGES: Endpoint.CHAT},
        request=lambda body, provider: anthropic_to_openai(body),
        body=openai_to_anthropic_body,
        stream=lambda include_usage: OpenAIToAnthropicStream(),
    ),
)


def default_wires() -> list[Wire | Translation]:
    """The wires the core speaks itself, and the translations between them."""
    return [OPENAI, ANTHROPIC, *TRANSLATIONS]


@attrs.frozen
class Wires:
    """Every wire and translation of one generation, by name."""

    wires: Mapping[str, Wire]
    translations: Mapping[tuple[str, str], Translation]

    @classmethod
    def of(cls, items: Iterable[Wire | Translation]) -> Wires:
        """Collect them; a name or a pair registered twice raises ValueError."""
        wires: dict[str, Wire] = {}
        translations: dict[tuple[str, str], Translation] = {}
        for item in items:
            if isinstance(item, Wire):
                if item.name in wires:
                    raise ValueError(f"two plugins register wire {item.name!r}")
                wires[item.name] = item
            else:
                pair = (item.client, item.provider)
                if pair in translations:
                    raise ValueError(f"two plugins translate {item.client} to {item.provider}")
                translations[pair] = item
        return cls(wires, translations)

    def get(self, name: str) -> Wire | None:
        return self.wires.get(name)

    def translation(self, client: Wire, provider: Wire) -> Translation | None:
        return self.translations.get((client.name, provider.name))


# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_MESSAGES = Endpoint.MESSAGES


def wire_for(endpoint: Endpoint) -> Wire:
    """The wire format callers of ``endpoint`` speak (the core's endpoints are its own)."""
    return ANTHROPIC if endpoint is _MESSAGES else OPENAI
