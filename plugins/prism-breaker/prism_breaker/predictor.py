"""The opt-in health predictor: a small trained model that may mark a binding ``suspect``.

``[prism:breaker] predictor = PATH`` names a JSON model written by the
incident lab (``prism-lab predict``): a logistic regression over features
the breaker computes from its own trackers (window error rate, failures in
a row, the recent share of failures, timeouts and 429s among attempts,
first-byte latency against the binding's baseline median and its trend,
attempts in flight), with the horizon it was trained for and the precision
it reached on held-out scenarios.  Scoring is plain arithmetic: the breaker
needs no machine-learning library at run time.

The model only ever adds a reason to suspect a binding (which caps its
concurrent calls, ``suspect_max_inflight``); it never isolates one, and the
suspicion clears when the probability falls back.  A model whose recorded
held-out precision is below ``predictor_precision_floor`` is not used.

The same feature code serves the lab, which computes the features from
``/prism/health`` samples, and the breaker, which computes them from its
trackers: what the model was trained on is what it is shown.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from .health import BindingHealth

__all__ = [
    "FEATURES",
    "FORMAT",
    "History",
    "Model",
    "ModelError",
    "Predictions",
    "Signals",
    "features",
    "load_model",
    "signals_from_health",
    "signals_of",
]

#: The model file's ``format``: a file of another format is refused at start-up.
FORMAT = "prism-breaker-predictor/1"

#: The features, in the order the model's coefficients follow.
FEATURES = (
    "error_rate",
    "consecutive",
    "recent_failure_share",
    "recent_timeout_share",
    "recent_429_share",
    "latency_p50_ratio",
    "latency_p95_ratio",
    "latency_trend",
    "in_flight",
)

#: Outcomes that count against a binding (the machine's COUNTED_FAILURES, by name).
_FAILURES = ("transient", "timeout", "permanent", "broken_stream")
#: Latency ratios are taken in log and capped: a 1000x outlier must not swamp the rest.
_RATIO_CAP = 100.0


class ModelError(ValueError):
    """A model file that cannot be used: the message says why."""


@attrs.frozen
class Signals:
    """One binding's raw signals at one moment (``at``: seconds on the caller's clock)."""

    at: float
    #: Attempts by outcome since the binding was first seen (cumulative).
    counts: Mapping[str, int]
    error_rate: float
    consecutive: int
    in_flight: int
    #: Stream first-byte p50, p95 and baseline median over the latency window (ms).
    p50_ms: float | None
    p95_ms: float | None
    median_ms: float | None


def signals_from_health(entry: Mapping[str, Any], at: float) -> Signals:
    """The signals in one binding entry of ``/prism/health`` (what the lab records)."""
    stream = (entry.get("first_byte_ms") or {}).get("stream") or {}
    counts = {k: int(v) for k, v in (entry.get("counts") or {}).items() if k != "stale_ignored"}
    return Signals(
        at=at,
        counts=counts,
        error_rate=float((entry.get("window") or {}).get("error_rate") or 0.0),
        consecutive=int(entry.get("consecutive_failures") or 0),
        in_flight=int(entry.get("in_flight") or 0),
        p50_ms=stream.get("p50"),
        p95_ms=stream.get("p95"),
        median_ms=stream.get("baseline_median"),
    )


def signals_of(h: BindingHealth, now: float) -> Signals:
    """The same signals, from the breaker's own trackers (as ``/prism/health`` builds them)."""
    h.errors.prune(now)
    stream = h.latency["stream"].percentiles(now)
    return Signals(
        at=now,
        counts=dict(h.counts),
        error_rate=h.errors.rate,
        consecutive=h.consecutive,
        in_flight=h.in_flight,
        p50_ms=stream["p50"],
        p95_ms=stream["p95"],
        median_ms=stream["baseline_median"],
    )


def _log_ratio(value: float | None, median: float | None) -> float:
    if value is None or median is None or median <= 0:
        return 0.0
    return math.log(min(_RATIO_CAP, max(1.0 / _RATIO_CAP, value / median)))


def features(now: Signals, before: Signals | None) -> list[float]:
    """The model's inputs (``FEATURES`` order): ``now``, and ``before`` for the recent shares."""
    old: Mapping[str, int] = before.counts if before is not None else {}
    delta = {k: v - old.get(k, 0) for k, v in now.counts.items()}
    # A restart or an isolation may lower nothing (counts only grow), but stay safe.
    attempts = sum(max(0, v) for v in delta.values())

    def share(*names: str) -> float:
        return sum(max(0, delta.get(n, 0)) for n in names) / attempts if attempts else 0.0

    p50 = _log_ratio(now.p50_ms, now.median_ms)
    then = _log_ratio(before.p50_ms, before.median_ms) if before is not None else p50
    return [
        now.error_rate,
        min(now.consecutive, 10) / 10,
        share(*_FAILURES),
        share("timeout"),
        share("rate_limited"),
        p50,
        _log_ratio(now.p95_ms, now.median_ms),
        p50 - then,
        math.log1p(max(0, now.in_flight)),
    ]


@attrs.define
class History:
    """One binding's recent signals: what ``features`` compares against ``lookback_s`` ago."""

    lookback_s: float
    entries: collections.deque[Signals] = attrs.field(factory=collections.deque)

    def add(self, signals: Signals) -> list[float]:
        """Record ``signals`` and return the features at that moment."""
        entries = self.entries
        horizon = signals.at - self.lookback_s
        # Keep the newest entry at or before the horizon: it is the "before".
        while len(entries) >= 2 and entries[1].at <= horizon:
            entries.popleft()
        before = entries[0] if entries else None
        entries.append(signals)
        return features(signals, before)


@attrs.frozen(eq=False)
class Model:
    """A logistic regression over standardised ``FEATURES``, as the lab exported it."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    #: Probability above which a binding is suspected.
    threshold: float
    #: Seconds ahead the model was trained to see (the chain fully unavailable within).
    horizon_s: float
    #: Seconds back the recent shares and the latency trend look.
    lookback_s: float
    #: Precision at ``threshold`` on scenarios held out of training.
    precision: float
    source: str = ""

    def probability(self, x: Sequence[float]) -> float:
        z = self.intercept
        for value, mean, scale, coef in zip(x, self.mean, self.scale, self.coef, strict=True):
            z += coef * (value - mean) / scale
        if z < -60:  # exp overflows long before a probability stops being zero
            return 0.0
        return 1.0 / (1.0 + math.exp(-z))


def _numbers(data: Mapping[str, Any], key: str, n: int) -> tuple[float, ...]:
    value = data.get(key)
    if (
        not isinstance(value, list)
        or len(value) != n
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise ModelError(f"{key}: expected a list of {n} numbers")
    return tuple(float(v) for v in value)


def _number(data: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ModelError(f"{key}: expected a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def load_model(path: Path) -> Model:
    """Read and check a model file; raises ModelError naming what is wrong."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ModelError(f"cannot be read: {exc.strerror}") from None
    except ValueError as exc:
        raise ModelError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"format: expected {FORMAT!r}")
    names = data.get("features")
    if names != list(FEATURES):
        raise ModelError(f"features: expected {list(FEATURES)} (the breaker computes these)")
    n = len(FEATURES)
    scale = _numbers(data, "scale", n)
    if any(s <= 0 for s in scale):
        raise ModelError("scale: every entry must be above 0")
    held_out = data.get("held_out")
    if not isinstance(held_out, dict):
        raise ModelError("held_out: expected the held-out evaluation ({precision, ...})")
    return Model(
        features=FEATURES,
        mean=_numbers(data, "mean", n),
        scale=scale,
        coef=_numbers(data, "coef", n),
        intercept=_number(data, "intercept", -1e6, 1e6),
        threshold=_number(data, "threshold", 0.0, 1.0),
        horizon_s=_number(data, "horizon_s", 0.0, 1e6),
        lookback_s=_number(data, "lookback_s", 0.0, 1e6),
        precision=_number(held_out, "precision", 0.0, 1.0),
        source=str(path),
    )


@attrs.define
class Predictions:
    """The machine's side of the predictor: each binding's history and latest verdict.

    A binding is scored at most once per ``interval_s`` (scoring reads its
    latency percentiles and builds its features); between scores the
    latest verdict stands, so the suspicion it raised does not flicker.
    """

    interval_s: float = 1.0
    histories: dict[str, History] = attrs.field(factory=dict)
    #: binding → (when scored, probability).
    latest: dict[str, tuple[float, float]] = attrs.field(factory=dict)

    def reason(self, model: Model, h: BindingHealth, now: float) -> str | None:
        """Why the model suspects ``h`` now, or None."""
        scored = self.latest.get(h.binding)
        if scored is None or now - scored[0] >= self.interval_s:
            history = self.histories.get(h.binding)
            if history is None or history.lookback_s != model.lookback_s:
                history = self.histories[h.binding] = History(model.lookback_s)
            scored = (now, model.probability(history.add(signals_of(h, now))))
            self.latest[h.binding] = scored
        probability = scored[1]
        if probability <= model.threshold:
            return None
        return (
            f"predictor: {probability:.0%} chance the chain is unavailable within "
            f"{model.horizon_s:g} s (threshold {model.threshold:.0%})"
        )
