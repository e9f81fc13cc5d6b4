"""Wire formats: what the core knows of each API it speaks to callers and upstreams."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..call import Endpoint, Usage
from ..errors import PrismError
from . import anthropic, openai
from .events import ChunkKind

__all__ = ["ANTHROPIC", "OPENAI", "ChunkKind", "Wire", "wire_for", "wire_named"]


@attrs.frozen
class Wire:
    """One wire format's stream inspection, usage accounting and error shapes."""

    name: str
    inspect: Callable[[bytes], tuple[ChunkKind, Any]]
    usage_update: Callable[[Usage | None, Any], Usage | None]
    #: For a content event: (characters of answer text, whether it finishes the answer).
    digest: Callable[[Any], tuple[int, bool]]
    #: Recognises a plain text content event without parsing it (its text length), or None.
    plain_text_chars: Callable[[bytes], int | None]
    #: In ``buf[start:end]``, whole events, where the first one worth parsing may start (-1: none).
    first_notable: Callable[[bytes, int, int], int]
    estimate_usage: Callable[[dict[str, Any], int], Usage]
    #: Why a 200 body is not an answer of the endpoint (None: it is one, or it is an error).
    answer_problem: Callable[[Endpoint, Any], str | None]
    #: Characters of answer text in a whole answer that passed ``answer_problem``.
    answer_chars: Callable[[Any], int]
    error_body: Callable[[PrismError], bytes]
    error_event: Callable[[PrismError], bytes]
    #: The final event of a stream, written after the call is settled.
    done_event: bytes


OPENAI = Wire(
    name="openai",
    inspect=openai.chunk_kind,
    usage_update=openai.usage_update,
    digest=openai.digest,
    plain_text_chars=openai.plain_text_chars,
    first_notable=openai.first_notable,
    estimate_usage=openai.estimate_usage,
    answer_problem=openai.answer_problem,
    answer_chars=openai.answer_chars,
    error_body=openai.error_body,
    error_event=openai.error_event,
    done_event=openai.DONE_EVENT,
)

ANTHROPIC = Wire(
    name="anthropic",
    inspect=anthropic.event_kind,
    usage_update=anthropic.usage_update,
    digest=anthropic.digest,
    plain_text_chars=lambda data: None,
    first_notable=lambda buf, start, end: start,
    estimate_usage=anthropic.estimate_usage,
    answer_problem=anthropic.answer_problem,
    answer_chars=anthropic.answer_chars,
    error_body=anthropic.error_body,
    error_event=anthropic.error_event,
    done_event=anthropic.DONE_EVENT,
)

_WIRES = {wire.name: wire for wire in (OPENAI, ANTHROPIC)}


def wire_named(name: str) -> Wire:
    return _WIRES[name]


def wire_for(endpoint: Endpoint) -> Wire:
    """The wire format callers of ``endpoint`` speak."""
    return ANTHROPIC if endpoint is Endpoint.MESSAGES else OPENAI
