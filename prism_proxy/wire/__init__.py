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
from ..sse import event_data
from . import anthropic, openai, responses, responses_stream
from .events import ChunkKind
from .responses_stream import (
    AnthropicToResponsesStream,
    ChatToResponsesStream,
    anthropic_to_response_body,
    chat_to_response_body,
)
from .translate_request import anthropic_to_openai, openai_to_anthropic
from .translate_response import (
    AnthropicToOpenAIStream,
    OpenAIToAnthropicStream,
    StreamTranslator,
    StreamTranslatorBase,
    anthropic_to_openai_body,
    openai_to_anthropic_body,
)

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "RESPONSES",
    "ChunkKind",
    "StreamTranslator",
    "StreamTranslatorBase",
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
    #: Finish reasons (as ``finish_reason``/``digest`` give them) that mean a
    #: content filter or safety system cut the answer: never a normal success.
    filtered: frozenset[str] = frozenset()
    #: The request's parameters an answer in this wire repeats (Responses'
    #: ``instructions``, ``tools`` …), put over every answer the gateway builds.
    echo: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @classmethod
    def upstream(
        cls,
        name: str,
        *,
        inspect: Callable[[bytes], tuple[ChunkKind, Any]],
        usage_update: Callable[[Usage | None, Any], Usage | None],
        digest: Callable[[Any], tuple[int, str | None]],
        estimate_usage: Callable[[dict[str, Any], int], Usage],
        answer_problem: Callable[[Endpoint, Any], str | None],
        answer_chars: Callable[[Any], int],
        finish_reason: Callable[[Any], str | None],
        filtered: frozenset[str] = frozenset(),
    ) -> Wire:
        """A wire only upstreams speak (no caller does): what a provider plugin
        for a new API declares.  The caller-side parts (error bodies and events,
        the final event, the degraded answer) are never asked of it: callers
        speak the core's wires, and their answers are written in those."""

        def caller_side(*_: Any) -> Any:
            raise TypeError(f"wire {name!r} is spoken by upstreams only, never to callers")

        return cls(
            name=name,
            inspect=inspect,
            usage_update=usage_update,
            digest=digest,
            plain_run=_no_plain_run,
            estimate_usage=estimate_usage,
            answer_problem=answer_problem,
            answer_chars=answer_chars,
            finish_reason=finish_reason,
            error_body=caller_side,
            error_event=caller_side,
            done_event=b"",
            degraded_body=caller_side,
            degraded_events=caller_side,
            filtered=filtered,
        )


def _no_plain_run(datas: list[bytes]) -> tuple[int, int, None, int]:
    # Nothing of an upstream-only wire is forwarded as it is: every event is translated.
    return 0, 0, None, -1


@attrs.frozen
class Translation:
    """How a caller speaking ``client`` is served by an upstream speaking ``provider``.

    ``endpoints`` maps the caller's endpoint to the one the provider must
    serve natively; ``request`` turns the caller's body into the provider's
    (returning what it adjusted, or raising ``Untranslatable``), ``body``
    turns a whole answer back, and ``stream`` makes a stream translator.
    One whose ``client`` and ``provider`` are the same wire serves that
    wire's native lines (``Provider.native_wires``).
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
    filtered=frozenset({"content_filter"}),
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

#: OpenAI's Responses API: sent natively to a line that speaks it
#: (``Provider.native_wires``), else translated (onto chat for an OpenAI line,
#: onto Messages through chat for an Anthropic one).
RESPONSES = Wire(
    name="responses",
    inspect=responses.event_kind,
    usage_update=responses.usage_update,
    digest=responses.digest,
    finish_reason=responses.finish_reason,
    plain_run=lambda datas: (0, 0, None, -1),
    estimate_usage=responses.estimate_usage,
    answer_problem=responses.answer_problem,
    answer_chars=responses.answer_chars,
    error_body=responses.error_body,
    error_event=responses.error_event,
    done_event=responses.DONE_EVENT,
    degraded_body=responses_stream.degraded_body,
    degraded_events=responses_stream.degraded_events,
    echo=responses.repeated,
)


def _responses_to_anthropic(
    body: dict[str, Any], provider: Any
) -> tuple[dict[str, Any], list[str]]:
    chat, adjusted = responses.responses_to_chat(body)
    translated, more = openai_to_anthropic(chat, provider.default_max_tokens)
    return translated, adjusted + more


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
    Translation(
        client="responses",
        provider="openai",
        endpoints={Endpoint.RESPONSES: Endpoint.CHAT},
        request=lambda body, provider: responses.responses_to_chat(body),
        body=chat_to_response_body,
        stream=lambda include_usage: ChatToResponsesStream(),
    ),
    Translation(
        client="responses",
        provider="anthropic",
        endpoints={Endpoint.RESPONSES: Endpoint.MESSAGES},
        request=_responses_to_anthropic,
        body=anthropic_to_response_body,
        stream=lambda include_usage: AnthropicToResponsesStream(),
    ),
    Translation(
        client="responses",
        provider="responses",
        endpoints={Endpoint.RESPONSES: Endpoint.RESPONSES},
        request=lambda body, provider: responses.native_request(body),
        body=responses_stream.native_body,
        stream=lambda include_usage: responses_stream.NativeResponsesStream(),
    ),
)


def default_wires() -> list[Wire | Translation]:
    """The wires the core speaks itself, and the translations between them."""
    return [OPENAI, ANTHROPIC, RESPONSES, *TRANSLATIONS]


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
        """How ``client`` callers are served by ``provider`` lines, if they can be.

        A provider plugin for a new wire need only translate from OpenAI's chat
        wire: callers of another wire are then served through chat (their
        request translated to chat, then to the provider's; the answer back
        the same way), unless a plugin registered a direct translation.
        """
        pair = (client.name, provider.name)
        found = self.translations.get(pair)
        if found is None and PIVOT not in pair:
            into = self.translations.get((client.name, PIVOT))
            onto = self.translations.get((PIVOT, provider.name))
            pivot = self.wires.get(PIVOT)
            if into is not None and onto is not None and pivot is not None:
                found = through(into, onto, pivot)
        return found


#: The wire every translation may pass through: OpenAI's chat completions.
PIVOT = "openai"


def through(into: Translation, onto: Translation, pivot: Wire) -> Translation:
    """``into`` (client to pivot) then ``onto`` (pivot to provider), as one translation."""

    def request(body: dict[str, Any], provider: Any) -> tuple[dict[str, Any], list[str]]:
        middle, adjusted = into.request(body, provider)
        last, more = onto.request(middle, provider)
        return last, adjusted + more

    def answer(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
        return into.body(onto.body(payload, usage), usage)

    endpoints = {
        client: onto.endpoints[middle]
        for client, middle in into.endpoints.items()
        if middle in onto.endpoints
    }
    return Translation(
        client=into.client,
        provider=onto.provider,
        endpoints=endpoints,
        request=request,
        body=answer,
        stream=lambda include_usage: ChainedStream(
            onto.stream(True), into.stream(include_usage), pivot
        ),
    )


class ChainedStream(StreamTranslatorBase):
    """Two stream translators in a row: the first's events are read as the pivot wire's."""

    def __init__(self, first: StreamTranslator, second: StreamTranslator, pivot: Wire) -> None:
        self.first = first
        self.second = second
        self.pivot = pivot

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        return self._onward(self.first.convert(kind, payload))

    def finish(self, usage: Usage | None) -> list[bytes]:
        out = self._onward(self.first.finish(usage))
        out.extend(self.second.finish(usage))
        return out

    def _onward(self, events: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for event in events:
            data = event_data(event)
            if data is None:
                continue
            kind, payload = self.pivot.inspect(data)
            if kind is ChunkKind.DONE or kind is ChunkKind.INVALID:
                continue
            out.extend(self.second.convert(kind, payload))
        return out

    # The caller's side is the second translator's: what the answer repeats,
    # how a broken stream ends, and what it offers besides (``final``).
    def repeat(self, echo: Mapping[str, Any]) -> None:
        self.second.repeat(echo)

    def failed(self, err: PrismError) -> bytes | None:
        return self.second.failed(err)

    def __getattr__(self, name: str) -> Any:
        if name in ("first", "second", "pivot"):
            raise AttributeError(name)
        return getattr(self.second, name)


# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_CHAT, _MESSAGES, _RESPONSES = Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.RESPONSES


def wire_for(endpoint: Endpoint) -> Wire:
    """The wire format callers of ``endpoint`` speak (the core's endpoints are its own)."""
    # Chat first: the commonest call pays one comparison, as it always did.
    if endpoint is _CHAT:
        return OPENAI
    if endpoint is _MESSAGES:
        return ANTHROPIC
    return RESPONSES if endpoint is _RESPONSES else OPENAI
