"""What a served answer used: the upstream's report, checked against what was delivered.

An upstream's usage report decides the bill, and nothing forces it to be
true.  A report whose counts are not whole numbers, or that claims more
output than the call allowed or than the delivered text could hold, is
replaced by Prism's own estimate and marked ``suspect`` (the ledger row says
so).  Prompt counts are checked for form only: images and files sent by
URL make any size bound on them unsound.
"""

from __future__ import annotations

import attrs

from .call import Call, Endpoint, Usage
from .catalog import Binding
from .wire import wire_for

__all__ = ["OUTPUT_FLOOR", "OUTPUT_SLACK", "checked_usage", "estimate", "output_cap"]

#: Reported output may exceed the estimate from the delivered text this many
#: times (tokenisers differ; CJK text runs near a token a character) ...
OUTPUT_SLACK = 10
#: ... plus this many tokens, so that the report of a one-word answer stands.
OUTPUT_FLOOR = 16
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_EMBEDDINGS, _MESSAGES = Endpoint.EMBEDDINGS, Endpoint.MESSAGES


def output_cap(call: Call, binding: Binding) -> int | None:
    """The most output tokens the call could have produced, when anything bounds it."""
    endpoint = call.endpoint
    if endpoint is _EMBEDDINGS:
        return 0
    body = call.body
    caps = [binding.options.get("max_output_tokens")]
    choices = 1
    if endpoint is _MESSAGES:
        caps.append(body.get("max_tokens"))
    else:
        caps.append(body.get("max_completion_tokens") or body.get("max_tokens"))
        choices = body.get("n") or 1
    lowest: int | None = None
    for cap in caps:
        if type(cap) is int and (lowest is None or cap < lowest):
            lowest = cap
    return None if lowest is None else lowest * choices


def estimate(call: Call, delivered_chars: int) -> Usage:
    """Prism's own estimate of a call's usage, from its prompt and the text delivered."""
    return wire_for(call.endpoint).estimate_usage(call.body, delivered_chars)


def checked_usage(
    call: Call, binding: Binding, reported: Usage | None, delivered_chars: int
) -> Usage:
    """The usage to account for: ``reported`` when it can be true, else the estimate, flagged."""
    if reported is None:
        return estimate(call, delivered_chars)
    if reported.suspect:
        return attrs.evolve(estimate(call, delivered_chars), suspect=True)
    output = reported.output_tokens
    visible = output - reported.reasoning_tokens
    cap = output_cap(call, binding)
    if (
        visible < 0
        or (cap is not None and output > cap)
        or visible > -(-delivered_chars // 4) * OUTPUT_SLACK + OUTPUT_FLOOR
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
