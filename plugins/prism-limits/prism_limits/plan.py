"""What about one caller's limits on one model stays the same from call to call.

Worked out once per caller and model (per settings generation: the principal
object changes when its settings do), so that a call builds only what depends
on it: the asks whose amount varies (tpm's tokens, a budget's worst case) and
the rate-limit headers' values.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from prism_proxy import Principal

from .counting import Ask, Reading
from .limits import BUDGET, RPM, TPM, Limit, format_money
from .periods import Window

__all__ = ["Plan", "reset_text"]

#: ``0s`` … ``120s``: the reset headers' values, formatted once.
_SECONDS = tuple(f"{second}s" for second in range(121))


@attrs.define(eq=False)
class Plan:
    """The limits of one caller on one model, and how each call asks of them."""

    principal: Principal
    limits: tuple[Limit, ...]
    #: Per limit, its ask when it never varies (rpm, max_parallel: one request, one
    #: slot, shared by every call: asks are never changed); a placeholder each call
    #: replaces for the others.
    fixed: tuple[Ask, ...]
    #: The limits whose ask varies per call, with their index.
    varying: tuple[tuple[int, Limit], ...]
    tpm: bool
    budget: bool
    #: The indices of the rpm, tpm and budget limits (the headers' sources).
    requests: tuple[int, ...]
    tokens: tuple[int, ...]
    budgets: tuple[int, ...]
    #: Per limit, its value as a header says it (while it is not shared out).
    texts: tuple[str, ...] = ()
    #: Per budget limit's index, its current period and the counter named after it.
    counters: dict[int, tuple[Window, str]] = attrs.field(factory=dict)

    @classmethod
    def of(cls, principal: Principal, limits: Sequence[Limit]) -> Plan:
        fixed: list[Ask] = []
        varying: list[tuple[int, Limit]] = []
        for index, limit in enumerate(limits):
            varies = limit.metric == TPM or limit.metric == BUDGET
            fixed.append(Ask(limit, limit.counter, 0 if varies else 1))
            if varies:
                varying.append((index, limit))
        metrics = [limit.metric for limit in limits]
        return cls(
            principal,
            tuple(limits),
            tuple(fixed),
            tuple(varying),
            tpm=TPM in metrics,
            budget=BUDGET in metrics,
            requests=tuple(i for i, metric in enumerate(metrics) if metric == RPM),
            tokens=tuple(i for i, metric in enumerate(metrics) if metric == TPM),
            budgets=tuple(i for i, metric in enumerate(metrics) if metric == BUDGET),
            texts=tuple(str(limit.value) for limit in limits),
        )

    def headers(
        self, headers: dict[str, str], asks: Sequence[Ask], readings: Sequence[Reading]
    ) -> None:
        """OpenAI's rate-limit headers for the tightest rpm and tpm, and the budget left."""
        if not readings:
            return
        if self.requests:
            _rate_headers(headers, _REQUESTS, self.requests, self.texts, asks, readings)
        if self.tokens:
            _rate_headers(headers, _TOKENS, self.tokens, self.texts, asks, readings)
        indices = self.budgets
        if indices:
            at = indices[0] if len(indices) == 1 else _tightest(indices, readings)
            headers["x-prism-budget-remaining"] = format_money(readings[at][0])


#: The header names of OpenAI's requests and tokens trios, in (limit, remaining, reset) order.
_REQUESTS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
)
_TOKENS = ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


def _rate_headers(
    headers: dict[str, str],
    names: tuple[str, str, str],
    indices: tuple[int, ...],
    texts: tuple[str, ...],
    asks: Sequence[Ask],
    readings: Sequence[Reading],
) -> None:
    """OpenAI's limit, remaining and reset headers (``names``) for the tightest of ``indices``."""
    at = indices[0] if len(indices) == 1 else _tightest(indices, readings)
    remaining, reset, _ = readings[at]
    value = asks[at].value
    limit, left, resets = names
    headers[limit] = texts[at] if value < 0 else str(value)
    headers[left] = str(remaining)
    headers[resets] = _SECONDS[round(reset)] if 0.0 < reset < 120.0 else reset_text(reset)


def _tightest(indices: tuple[int, ...], readings: Sequence[Reading]) -> int:
    best = indices[0]
    for index in indices[1:]:
        if readings[index][0] < readings[best][0]:
            best = index
    return best


def reset_text(seconds: float) -> str:
    """``12s``: whole seconds (rounded as ``%.0f`` does), none below 0."""
    if seconds <= 0.0:
        return "0s"
    if seconds < 120.0:
        return _SECONDS[round(seconds)]
    return f"{seconds:.0f}s"
