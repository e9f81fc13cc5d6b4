"""The capacity rule: does a tier have the reserve to absorb the loss of one of its lines?

Each line with ``max_concurrency`` keeps the peak of its in-flight upstream
calls per minute over ``capacity_window_s`` (fleet-wide with prism-redis:
every gateway's minute peaks are added up, an upper bound of the fleet's).
For a tier (a model's chain) and each line A of it, the reserve is what the
other lines could still take at their own peaks, Σ over B ≠ A of
(max_concurrency_B - peak_B), and the rule fires when reserve_A < k x peak_A,
peak_A being A's largest minute in the window.  k (``capacity_k``) has no
default: ``prism capacity`` prints every line's peak distribution and the k
at which each tier would alert today, so that k is chosen from data.  A tier
with a line that has no ``max_concurrency`` has no known reserve: the rule
does not judge it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import attrs

from prism_proxy import Catalog, percentile

__all__ = ["BUCKET_S", "CapacityRule", "Judgement", "Peaks", "minutes_in"]

log = logging.getLogger("prism.metrics")

#: Peaks are kept per minute.
BUCKET_S = 60.0


@attrs.define(eq=False)
class LinePeaks:
    """One line's calls in flight now, and its peak in each minute."""

    in_flight: int = 0
    #: Minute number -> this gateway's peak in it.
    minutes: dict[int, int] = attrs.field(factory=dict)


@attrs.define(eq=False)
class Peaks:
    """Every line's peaks in this process; kept across generations (calls outlive them).

    Minutes are wall-clock minutes (the gateway's clock, anchored once to the
    wall), so gateways agree on which minute is which.
    """

    clock: Callable[[], float]
    lines: dict[str, LinePeaks] = attrs.field(factory=dict)
    #: Minute peaks the other gateways reported (line -> minute -> their sum); empty alone.
    others: dict[str, dict[int, int]] = attrs.field(factory=dict)
    offset: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.offset = time.time() - self.clock()

    def minute(self) -> int:
        return int((self.clock() + self.offset) // BUCKET_S)

    async def lifecycle(self) -> AsyncIterator[None]:
        yield  # memory only; prism-redis, when there, carries the minutes between gateways

    def change(self, line: str, delta: int) -> None:
        peaks = self.lines.get(line)
        if peaks is None:
            peaks = self.lines[line] = LinePeaks()
        peaks.in_flight += delta
        minute = self.minute()
        if peaks.in_flight > peaks.minutes.get(minute, 0):
            peaks.minutes[minute] = peaks.in_flight

    def distribution(self, line: str, window_s: float) -> list[int]:
        """The line's peak in every minute of the window (0 for a quiet one), oldest first."""
        now = self.minute()
        first = now - minutes_in(window_s) + 1
        own = self.lines.get(line)
        mine = own.minutes if own is not None else {}
        for minute in [m for m in mine if m < first]:
            del mine[minute]
        theirs = self.others.get(line, {})
        return [mine.get(m, 0) + theirs.get(m, 0) for m in range(first, now + 1)]


def minutes_in(window_s: float) -> int:
    return max(1, math.ceil(window_s / BUCKET_S))


@attrs.frozen
class Judgement:
    model: str
    line: str
    provider: str
    upstream_model: str
    peak: int
    reserve: int
    #: reserve / peak: the rule fires when it is below k (None: no peak, nothing to lose).
    ratio: float | None
    firing: bool


@attrs.define(eq=False)
class CapacityRule:
    """One generation's rule: its tiers, its k, and what it said last (to log changes)."""

    catalog: Catalog
    peaks: Peaks
    window_s: float
    k: float | None
    firing: set[tuple[str, str]] = attrs.field(factory=set)

    def tiers(self) -> Iterable[tuple[str, list[Any]]]:
        """Every model whose chain has two or more lines, all with ``max_concurrency``."""
        for model in self.catalog.models.values():
            lines = list(model.chain)
            if len(lines) > 1 and all("max_concurrency" in b.options for b in lines):
                yield model.name, lines

    def judge(self) -> list[Judgement]:
        out: list[Judgement] = []
        for model, lines in self.tiers():
            peak = {b.id: max(self.peaks.distribution(b.id, self.window_s)) for b in lines}
            for a in lines:
                reserve = sum(
                    b.options["max_concurrency"] - peak[b.id] for b in lines if b.id != a.id
                )
                ratio = reserve / peak[a.id] if peak[a.id] else None
                firing = self.k is not None and ratio is not None and ratio < self.k
                out.append(
                    Judgement(model, a.id, a.provider, a.model, peak[a.id], reserve, ratio, firing)
                )
        self._log_changes(out)
        return out

    def _log_changes(self, judgements: list[Judgement]) -> None:
        now = {(j.model, j.line) for j in judgements if j.firing}
        for j in judgements:
            key = (j.model, j.line)
            if j.firing and key not in self.firing:
                log.warning(
                    "capacity: tier %s cannot absorb losing %s: reserve %d < k %g x peak %d",
                    j.model,
                    j.line,
                    j.reserve,
                    self.k,
                    j.peak,
                )
            elif not j.firing and key in self.firing:
                log.warning("capacity: tier %s can absorb losing %s again", j.model, j.line)
        self.firing = now

    def banners(self) -> list[dict[str, str]]:
        return [
            {
                "kind": "capacity",
                "text": f"capacity: {model} cannot absorb losing {line} (k = {self.k:g})",
            }
            for model, line in sorted(self.firing)
        ]

    def report(self) -> dict[str, Any]:
        """Every limited line's peak distribution, and the k at which each tier alerts today."""
        lines: dict[str, dict[str, Any]] = {}
        for binding in self.catalog.bindings.values():
            limit = binding.options.get("max_concurrency")
            if limit is None:
                continue
            values = self.peaks.distribution(binding.id, self.window_s)
            ordered: list[float] = sorted(values)
            lines[binding.id] = {
                "max_concurrency": limit,
                "minutes": len(values),
                "p50": percentile(ordered, 0.50),
                "p95": percentile(ordered, 0.95),
                "p99": percentile(ordered, 0.99),
                "max": max(values),
            }
        tiers: list[dict[str, Any]] = []
        judgements = self.judge()
        for model, _ in self.tiers():
            mine = [j for j in judgements if j.model == model]
            ratios = [j.ratio for j in mine if j.ratio is not None]
            tiers.append(
                {
                    "model": model,
                    # The rule fires for any k above the smallest reserve/peak.
                    "alerts_above_k": round(min(ratios), 3) if ratios else None,
                    "lines": {
                        j.line: {"peak": j.peak, "reserve": j.reserve, "ratio": j.ratio}
                        for j in mine
                    },
                }
            )
        return {
            "window_s": self.window_s,
            "k": self.k,
            "lines": lines,
            "tiers": tiers,
            "firing": [{"model": m, "line": line} for m, line in sorted(self.firing)],
        }

    def gauges(self, metrics: Mapping[str, Any]) -> None:
        for j in self.judge():
            labels = (j.model, j.provider, j.upstream_model)
            if j.ratio is not None:
                metrics["prism_capacity_reserve_ratio"].labels(*labels).set(j.ratio)
            metrics["prism_capacity_alert"].labels(*labels).set(1 if j.firing else 0)
