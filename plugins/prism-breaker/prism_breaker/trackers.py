"""Rolling evidence for one binding: the error-rate window and first-token latency."""

from __future__ import annotations

import bisect
import collections
import enum

import attrs

from prism_proxy import percentile

__all__ = ["ErrorWindow", "LatencyTrack", "Slowness"]


@attrs.define
class ErrorWindow:
    """Counted outcomes (success or failure) over the last ``window_s`` seconds.

    With a fleet, ``others`` holds what the other gateways counted in the
    same window (refreshed off the hot path) and ``unsent`` this gateway's
    entries they have not been told of yet.
    """

    window_s: float
    entries: collections.deque[tuple[float, bool]] = attrs.field(factory=collections.deque)
    own_failures: int = 0
    #: The other gateways' (calls, failures) in this window.
    others: tuple[int, int] = (0, 0)
    #: Entries not yet reported to the fleet (None: no fleet to report to).
    unsent: list[tuple[float, bool]] | None = None

    def add(self, now: float, failed: bool) -> None:
        entries = self.entries
        if entries and entries[0][0] <= now - self.window_s:
            self.prune(now)
        entries.append((now, failed))
        self.own_failures += failed
        if self.unsent is not None:
            self.unsent.append((now, failed))

    def prune(self, now: float) -> None:
        horizon = now - self.window_s
        entries = self.entries
        while entries and entries[0][0] <= horizon:
            _, failed = entries.popleft()
            self.own_failures -= failed

    @property
    def calls(self) -> int:
        return len(self.entries) + self.others[0]

    @property
    def failures(self) -> int:
        return self.own_failures + self.others[1]

    @property
    def rate(self) -> float:
        calls = self.calls
        return self.failures / calls if calls else 0.0

    def clear(self) -> None:
        self.entries.clear()
        self.own_failures = 0
        self.others = (0, 0)
        if self.unsent is not None:
            self.unsent.clear()


class Slowness(enum.Enum):
    UNJUDGED = "unjudged"  # too few baseline samples to say
    NORMAL = "normal"
    SLOW = "slow"


# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_NORMAL, _UNJUDGED = Slowness.NORMAL, Slowness.UNJUDGED

#: At most this many samples per track: bounds memory and the cost of an observation.
MAX_SAMPLES = 2000


@attrs.define
class LatencyTrack:
    """A binding's own first-token latency: a rolling baseline and the current slow run.

    A sample is slow when it exceeds ``factor`` times the median of the
    baseline, which holds the non-slow samples of the last ``window_s``
    seconds.  Slow samples stay out of the baseline: otherwise a sustained
    slowdown would raise the median until it no longer looked slow, and the
    policy could never trip.  One normal sample ends a slow run.
    """

    factor: float
    window_s: float
    min_samples: int
    #: Every sample in the window (for p50/p95 reporting), oldest first.
    samples: collections.deque[tuple[float, float]] = attrs.field(factory=collections.deque)
    #: The same values kept sorted: percentiles are read as often as samples arrive, and
    #: sorting the whole window for each read cost more than the rest of an observation.
    sorted_samples: list[float] = attrs.field(factory=list)
    #: Baseline samples in arrival order, and the same values kept sorted.
    baseline: collections.deque[tuple[float, float]] = attrs.field(factory=collections.deque)
    sorted_baseline: list[float] = attrs.field(factory=list)
    slow_since: float | None = None
    slow_count: int = 0
    #: The other gateways' baselines, as (samples, median ms); empty without a fleet.
    others: list[tuple[int, float]] = attrs.field(factory=list)
    #: A sample at or below this is never slow: against a median of a few ms, 3x is
    #: the gateway's own queueing under load (its event loop's lag), not the upstream.
    floor_ms: float = 0.0

    def observe(self, now: float, ms: float) -> Slowness:
        # Called on every answer: pruning waits until something has aged out.
        samples, baseline = self.samples, self.baseline
        horizon = now - self.window_s
        if (samples and samples[0][0] <= horizon) or (baseline and baseline[0][0] <= horizon):
            self.prune(now)
        samples.append((now, ms))
        ordered = self.sorted_samples
        bisect.insort(ordered, ms)
        if len(samples) > MAX_SAMPLES:
            _, old = samples.popleft()
            del ordered[bisect.bisect_left(ordered, old)]
        median = self.median()
        if median is not None and ms > self.factor * median and ms > self.floor_ms:
            if self.slow_since is None:
                self.slow_since = now
            self.slow_count += 1
            return Slowness.SLOW
        if self.slow_since is not None:  # a slow run to end (slow samples set it)
            self._end_run()
        values = self.sorted_baseline
        baseline.append((now, ms))
        bisect.insort(values, ms)
        if len(baseline) > MAX_SAMPLES:
            _, old = baseline.popleft()
            del values[bisect.bisect_left(values, old)]
        return _UNJUDGED if median is None else _NORMAL

    def median(self) -> float | None:
        """The baseline median, or None while there are too few samples to judge.

        With a fleet, the median of every gateway's baseline median weighted
        by its samples: close to the fleet's true median when the gateways
        see the same upstream, at the cost of one pair of numbers each.
        """
        if not self.others:
            values = self.sorted_baseline
            return _median(values) if values and len(values) >= self.min_samples else None
        own = self.own_median()
        parts = [*self.others]
        if own is not None:
            parts.append((len(self.sorted_baseline), own))
        total = sum(count for count, _ in parts)
        if total < self.min_samples:
            return None
        seen = 0
        for count, median in sorted(parts, key=lambda part: part[1]):
            seen += count
            if 2 * seen >= total:
                return median
        return None  # unreachable: the counts add up to total

    def own_median(self) -> float | None:
        """This gateway's baseline median, however few samples it has (None: none)."""
        return _median(self.sorted_baseline) if self.sorted_baseline else None

    def slow_for(self, now: float) -> float:
        return 0.0 if self.slow_since is None else now - self.slow_since

    def prune(self, now: float) -> None:
        horizon = now - self.window_s
        samples, ordered = self.samples, self.sorted_samples
        while samples and samples[0][0] <= horizon:
            _, ms = samples.popleft()
            del ordered[bisect.bisect_left(ordered, ms)]
        while self.baseline and self.baseline[0][0] <= horizon:
            _, ms = self.baseline.popleft()
            del self.sorted_baseline[bisect.bisect_left(self.sorted_baseline, ms)]

    def percentiles(self, now: float) -> dict[str, float | int | None]:
        self.prune(now)
        values = self.sorted_samples
        return {
            "p50": percentile(values, 0.50),
            "p95": percentile(values, 0.95),
            "samples": len(values),
            "baseline_median": self.median(),
        }

    def reset_run(self) -> None:
        self._end_run()

    def _end_run(self) -> None:
        self.slow_since = None
        self.slow_count = 0


def _median(values: list[float]) -> float:
    """The median of sorted, non-empty ``values``."""
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2
