"""What a call counts, kept in plain dicts and folded into prometheus-client later.

prometheus-client takes a lock for every increment and walks a histogram's
buckets for every observation: eight of those per call cost more than the
rest of the plugin.  The hot path adds to a dict entry per labelled child
instead; :meth:`Tally.fold` hands the sums over when someone looks (a scrape)
and a few times a second (so that other workers' scrapes see them too).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

__all__ = ["Tally"]


class _Buckets:
    """One histogram child's observations since the last fold."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0


class Tally:
    """Increments and observations per prometheus-client child, not yet applied."""

    def __init__(self) -> None:
        self._amounts: dict[Any, float] = {}
        self._buckets: dict[Any, _Buckets] = {}

    def add(self, child: Any, amount: float = 1.0) -> None:
        """``child.inc(amount)``, later (a gauge's may be negative)."""
        amounts = self._amounts
        amounts[child] = amounts.get(child, 0.0) + amount

    def observe(self, child: Any, value: float) -> None:
        """``child.observe(value)`` of a histogram child, later."""
        buckets = self._buckets.get(child)
        if buckets is None:
            buckets = self._buckets[child] = _Buckets(list(child._upper_bounds))
        # prometheus-client's rule: the first bucket whose bound is >= the value.
        buckets.counts[bisect_left(buckets.bounds, value)] += 1
        buckets.total += value

    def fold(self) -> None:
        """Apply everything counted since the last fold."""
        amounts, self._amounts = self._amounts, {}
        for child, amount in amounts.items():
            if amount:
                child.inc(amount)
        histograms, self._buckets = self._buckets, {}
        for child, buckets in histograms.items():
            # What Histogram.observe does for each value, once per bucket instead.
            child._sum.inc(buckets.total)
            for index, count in enumerate(buckets.counts):
                if count:
                    child._buckets[index].inc(count)
