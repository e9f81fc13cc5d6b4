"""Live scores per line, and the power-of-two-choices order drawn from them.

A line's score is ``latency + error_penalty_ms * error_rate`` in milliseconds,
lower is better, where both terms are time-decayed averages of the attempts
observed on it (see :class:`Stat`).  A line with no samples of a term takes
the mean of that term over the other lines being ordered: neutral, so it is
neither favoured nor shunned until it has been tried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Hashable, Sequence

__all__ = ["Scores", "Stat", "draw_order", "scores_of"]


class Stat:
    """One upstream line's samples, each weighing half as much every ``half_life_s``.

    The sums decay with the gateway clock, not per sample, so what a score
    means does not depend on traffic: at one call a minute or a hundred a
    second, the last half-life's samples weigh as much as everything before.
    """

    __slots__ = ("at", "error_sum", "error_weight", "latency_sum", "latency_weight")

    def __init__(self) -> None:
        self.at: float | None = None
        self.latency_sum = 0.0
        self.latency_weight = 0.0
        self.error_sum = 0.0
        self.error_weight = 0.0

    def observe(
        self, now: float, half_life_s: float, *, latency_ms: float | None, error: bool
    ) -> None:
        """Add one classified attempt: its first-token latency (answers only) and error bit."""
        at = self.at
        if at is None or now > at:
            if at is not None:
                keep = 0.5 ** ((now - at) / half_life_s)
                self.latency_sum *= keep
                self.latency_weight *= keep
                self.error_sum *= keep
                self.error_weight *= keep
            self.at = now
        if latency_ms is not None:
            self.latency_sum += latency_ms
            self.latency_weight += 1.0
        self.error_weight += 1.0
        if error:
            self.error_sum += 1.0

    @property
    def latency_ms(self) -> float | None:
        """The decayed mean first-token latency, or None before the first answer."""
        return self.latency_sum / self.latency_weight if self.latency_weight > 0 else None

    @property
    def error_rate(self) -> float | None:
        """The decayed share of attempts that failed, or None before the first attempt."""
        return self.error_sum / self.error_weight if self.error_weight > 0 else None

    def __repr__(self) -> str:
        return f"Stat(latency_ms={self.latency_ms!r}, error_rate={self.error_rate!r})"


class Scores:
    """Every line's :class:`Stat`, kept across reloads (``generation.keep``).

    Keyed by (binding id, catalog fingerprint): a line whose URL, credential
    or model changed in a reload starts afresh, and evidence an older
    generation still gathers about the old line never counts against it.
    """

    def __init__(self) -> None:
        self.stats: dict[Hashable, Stat] = {}

    def stat(self, key: Hashable) -> Stat:
        found = self.stats.get(key)
        if found is None:
            found = self.stats[key] = Stat()
        return found

    def retain(self, keys: Collection[Hashable]) -> None:
        """Forget the lines the generation serving now does not have."""
        for key in [k for k in self.stats if k not in keys]:
            del self.stats[key]

    async def lifecycle(self) -> AsyncIterator[None]:
        """Nothing to open or close: scores live in memory and die with the process."""
        yield


def scores_of(stats: Sequence[Stat | None], error_penalty_ms: float) -> list[float]:
    """Each line's score (ms, lower is better); a term without samples is the others' mean."""
    latencies = [s.latency_ms if s is not None else None for s in stats]
    errors = [s.error_rate if s is not None else None for s in stats]
    known_latencies = [x for x in latencies if x is not None]
    known_errors = [x for x in errors if x is not None]
    neutral_latency = sum(known_latencies) / len(known_latencies) if known_latencies else 0.0
    neutral_error = sum(known_errors) / len(known_errors) if known_errors else 0.0
    return [
        (latency if latency is not None else neutral_latency)
        + error_penalty_ms * (error if error is not None else neutral_error)
        for latency, error in zip(latencies, errors, strict=True)
    ]


def draw_order(
    scores: Sequence[float], weights: Sequence[float], random: Callable[[], float]
) -> list[int]:
    """An order of the indexes of ``scores`` by power of two choices.

    For each position, two candidates are drawn independently (so possibly
    the same one twice) among those not placed yet, each with probability
    proportional to its weight; the better score takes the position (the
    first drawn on a tie).  The best line wins most positions, yet every
    line leads with probability at least (its share of the weight)^2: a
    fast line is never handed all the load, and a slow one keeps being
    measured, so the order follows a line that recovers or degrades.
    """
    remaining = list(range(len(scores)))
    order: list[int] = []
    while len(remaining) > 1:
        total = sum(weights[i] for i in remaining)
        first = _draw(remaining, weights, total, random)
        second = _draw(remaining, weights, total, random)
        winner = first if scores[first] <= scores[second] else second
        order.append(winner)
        remaining.remove(winner)
    order.extend(remaining)
    return order


def _draw(
    remaining: Sequence[int], weights: Sequence[float], total: float, random: Callable[[], float]
) -> int:
    point = random() * total
    for index in remaining:
        point -= weights[index]
        if point < 0:
            return index
    return remaining[-1]  # random() * total rounded up to total
