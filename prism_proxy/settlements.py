"""How a call can end: one constructor per kind, the only place the core builds a Settlement.

An endpoint's every path returns an :class:`~prism_proxy.answers.Answer`,
which cannot be made without its settlement, or is cancelled; so the type
checker, not a runtime check, proves that every call is settled, and each
kind of end (served, broken, refused, degraded, aborted) is recorded the same
way wherever it happens.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from .call import Attempt, Outcome, Settlement, Usage
from .classification import CONTENT_FILTERED
from .errors import PrismError

__all__ = ["CLIENT_CLOSED", "Abandoned", "aborted", "broken", "degraded", "refused", "served"]

#: The code of a call whose caller left before its answer was whole.
CLIENT_CLOSED = "client_closed"
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_EMPTY, _FILTERED = Outcome.EMPTY, Outcome.CONTENT_FILTERED


def served(attempt: Attempt, usage: Usage) -> Settlement:
    """Served in full by ``attempt``; ``empty`` when its completion was (served flagged),
    ``content_filtered`` when a content filter cut it (code ``content_filtered``)."""
    if attempt.outcome is _FILTERED:
        return Settlement(
            outcome="content_filtered",
            status=200,
            served=attempt,
            usage=usage,
            error_code=CONTENT_FILTERED,
        )
    outcome: Literal["ok", "empty"] = "empty" if attempt.outcome is _EMPTY else "ok"
    return Settlement(outcome=outcome, status=200, served=attempt, usage=usage)


def broken(attempt: Attempt, usage: Usage, err: PrismError) -> Settlement:
    """A stream that broke after its commit point: its 200 had left, and what was
    delivered (``usage``) is still billable."""
    return Settlement(
        outcome="error", status=200, served=attempt, usage=usage, error_code=err.code
    )


def refused(err: PrismError) -> Settlement:
    """Nothing served: the caller is answered ``err`` (bad input, a refusal, an
    exhausted chain, Prism's own failure); ``content_filtered`` when a content
    filter refused it."""
    if err.code.endswith(CONTENT_FILTERED):
        return Settlement(outcome="content_filtered", status=err.status, error_code=err.code)
    return Settlement(outcome="error", status=err.status, error_code=err.code)


def degraded(err: PrismError) -> Settlement:
    """The operator's templated answer, sent with 200 in place of ``err``: nobody served it."""
    return Settlement(outcome="error", status=200, error_code=err.code)


def aborted(served: Attempt | None, usage: Usage | None = None) -> Settlement:
    """The caller left (or shutdown's grace ran out) before its answer was whole;
    ``served``'s answer, as far as ``usage`` says it was delivered, is billable."""
    return Settlement(
        outcome="aborted", status=499, served=served, usage=usage, error_code=CLIENT_CLOSED
    )


class Abandoned(asyncio.CancelledError):
    """A call cancelled mid-answer, with its settlement as the relay knew it.

    Still a cancellation to every frame it passes through (nothing may swallow
    it); the endpoint settles with :attr:`settlement` before it goes on.
    Without it, a cancelled call is settled as ``aborted(call.served)``: only a
    relay knows how much of a stream was delivered.
    """

    def __init__(self, settlement: Settlement) -> None:
        super().__init__("the call was cancelled mid-answer")
        self.settlement = settlement
