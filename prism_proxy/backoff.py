"""Backoff between retries of one binding: exponential, capped, with full jitter."""

from __future__ import annotations

from collections.abc import Callable

import attrs

__all__ = ["Backoff"]


@attrs.frozen
class Backoff:
    """``delay(n)`` for the n-th retry (0-based) is uniform in ``[0, min(cap, base * 2**n))``.

    Full jitter spreads retries of many callers hit by the same outage, so
    they do not come back in lockstep.
    """

    base_s: float
    cap_s: float

    def ceiling(self, retry: int) -> float:
        return min(self.cap_s, self.base_s * 2.0 ** min(retry, 32))

    def delay(self, retry: int, random: Callable[[], float]) -> float:
        return random() * self.ceiling(retry)
