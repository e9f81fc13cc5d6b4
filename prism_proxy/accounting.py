"""What a served answer used: the upstream's report, checked against what was delivered.

An upstream's usage report decides the bill, and nothing forces it to be
true.  A report whose counts are not whole numbers, or that claims more
output than the call allowed or than the delivered text could hold, is
replaced by Prism's own estimate and marked ``suspect`` (the ledger row says
so).  Output the caller cannot read (reasoning, thinking whose text is a
summary or encrypted, all of an empty answer) is bounded by what the call
allowed only: its text says nothing of its size.  Prompt counts are checked
for form only: images and files sent by URL make any size bound on them
unsound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .call import Call, Endpoint, Outcome, Usage
from .catalog import Binding
from .dispatch import Served
from .wire import wire_for

__all__ = [
    "OUTPUT_CEILING",
    "OUTPUT_FLOOR",
    "OUTPUT_SLACK",
    "checked_usage",
    "estimate",
    "output_cap",
]

#: Reported output may exceed the estimate from the delivered text this many
#: times (tokenisers differ; CJK text runs near a token a character) ...
OUTPUT_SLACK = 10
#: ... plus this many tokens, so that the report of a one-word answer stands.
OUTPUT_FLOOR = 16
#: The most output tokens one answer (per choice) can hold when neither the
#: request nor the chain line caps it: no model writes more than a few hundred
#: thousand, and output the text cannot bound must still be bounded by something.
OUTPUT_CEILING = 1_000_000
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_CHAT, _EMBEDDINGS = Endpoint.CHAT, Endpoint.EMBEDDINGS
_MESSAGES, _RESPONSES = Endpoint.MESSAGES, Endpoint.RESPONSES
_EMPTY, _FILTERED = Outcome.EMPTY, Outcome.CONTENT_FILTERED


def output_cap(endpoint: Endpoint, body: Mapping[str, Any], binding: Binding) -> int:
    """The most output tokens a request (as the upstream received it) could produce."""
    if endpoint is _EMBEDDINGS:
        return 0
    caps = [binding.options.get("max_output_tokens")]
    choices = 1
    # Chat first: it pays the one comparison it always did.
    if endpoint is _CHAT:
        caps.append(body.get("max_completion_tokens") or body.get("max_tokens"))
        choices = body.get("n") or 1
    elif endpoint is _MESSAGES:
        caps.append(body.get("max_tokens"))
    elif endpoint is _RESPONSES:
        caps.append(body.get("max_output_tokens"))
    lowest = OUTPUT_CEILING
    for cap in caps:
        if type(cap) is int and cap < lowest:
            lowest = cap
    return lowest * choices


def estimate(call: Call, delivered_chars: int) -> Usage:
    """Prism's own estimate of a call's usage, from its prompt and the text delivered."""
    return wire_for(call.endpoint).estimate_usage(call.body, delivered_chars)


def checked_usage(
    call: Call, served: Served, reported: Usage | None, delivered_chars: int
) -> Usage:
    """The usage to account for: ``reported`` when it can be true, else the estimate, flagged.

    The cap is the one the upstream was sent (a translated request's
    defaulted ``max_tokens`` included).  The delivered text bounds the
    visible output only when it can measure it: not ``reasoning_tokens``, and
    nothing when the reasoning's share is unmeasured or the answer is empty
    (cut at its limit before anything the caller could read).
    """
    if reported is None:
        return estimate(call, delivered_chars)
    if reported.suspect:
        return attrs.evolve(estimate(call, delivered_chars), suspect=True)
    output = reported.output_tokens
    visible = output - reported.reasoning_tokens
    prepared = served.prepared
    cap = output_cap(prepared.endpoint, prepared.body, served.attempt.binding)
    # A filtered answer's withheld text was generated (and billed upstream) all the same.
    measured = not (
        served.attempt.outcome is _EMPTY
        or served.attempt.outcome is _FILTERED
        or (reported.reasoning_unmeasured and not reported.reasoning_tokens)
    )
    if (
        visible < 0
        or output > cap
        or (measured and visible > -(-delivered_chars // 4) * OUTPUT_SLACK + OUTPUT_FLOOR)
    ):
        return attrs.evolve(
            reported,
            output_tokens=estimate(call, delivered_chars).output_tokens,
            reasoning_tokens=0,
            estimated=True,
            suspect=True,
        )
    if reported.cached_input_tokens + reported.cache_creation_tokens > reported.input_tokens:
        return attrs.evolve(
            reported,
            input_tokens=estimate(call, delivered_chars).input_tokens,
            cached_input_tokens=0,
            cache_creation_tokens=0,
            estimated=True,
            suspect=True,
        )
    return reported
