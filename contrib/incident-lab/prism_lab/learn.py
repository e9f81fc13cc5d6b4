"""``prism-lab predict``'s learning half: label the recorded moments, train, evaluate, export.

Each row is one binding at one scenario second, while the breaker would
consult the predictor (the binding eligible or suspect, the chain not yet
down): its features as the breaker computes them, and whether the chain is
fully unavailable within the next ``horizon_s``. Scenarios, not rows, are
split into training, validation (where the threshold is chosen) and
held-out sets, so no incident is seen both in training and in the verdict.
"""

from __future__ import annotations

import importlib
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

import attrs
from prism_breaker.predictor import FEATURES, FORMAT, History, Model

from .generate import chain_down
from .record import Recording

__all__ = ["Row", "Trained", "evaluate", "export", "label", "train"]

#: Moments before this (scenario seconds) are left out: the baselines are still empty.
WARMUP_S = 10.0
#: The states in which the breaker consults the predictor.
_CONSULTED = ("eligible", "suspect")


@attrs.frozen
class Row:
    scenario: int
    binding: str
    #: The binding's place in the chain (0: the first line).
    line: int
    t: float
    x: tuple[float, ...]
    y: bool
    in_flight: int


def _down_within(recording: Recording, t: float, horizon_s: float) -> bool:
    step = 0.25
    u = t + step
    while u <= t + horizon_s:
        if chain_down(recording.scenario, "chat", u):
            return True
        u += step
    return False


def label(recordings: Sequence[Recording], horizon_s: float, lookback_s: float) -> list[Row]:
    """Every consulted moment of every recording, with its features and its label."""
    rows = []
    for i, recording in enumerate(recordings):
        chain = recording.scenario.models["chat"]["chain"]
        for line, entry in enumerate(chain):
            binding = f"{entry['provider']}/{entry['model']}"
            history = History(lookback_s)
            for signals, state in recording.bindings.get(binding, []):
                x = history.add(signals)
                t = signals.at
                if (
                    t < WARMUP_S
                    or state not in _CONSULTED
                    or chain_down(recording.scenario, "chat", t)
                ):
                    continue
                y = _down_within(recording, t, horizon_s)
                rows.append(Row(i, binding, line, t, tuple(x), y, signals.in_flight))
    return rows


@attrs.frozen
class Trained:
    model: Model
    #: The scenario indices of each part.
    train: tuple[int, ...]
    validation: tuple[int, ...]
    held_out: tuple[int, ...]
    #: scikit-learn's pipeline (scaler + logistic regression), for the parity check.
    pipeline: Any


def split(n: int, seed: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Scenario indices for training, validation and held out (about 50/25/25)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held = max(1, round(n / 4))
    val = max(1, round(n / 4))
    return (
        tuple(sorted(order[held + val :])),
        tuple(sorted(order[held : held + val])),
        tuple(sorted(order[:held])),
    )


def _counts(rows: Sequence[Row], p: Sequence[float], threshold: float) -> tuple[int, int, int]:
    tp = sum(1 for r, q in zip(rows, p, strict=True) if q > threshold and r.y)
    fp = sum(1 for r, q in zip(rows, p, strict=True) if q > threshold and not r.y)
    fn = sum(1 for r, q in zip(rows, p, strict=True) if q <= threshold and r.y)
    return tp, fp, fn


def choose_threshold(rows: Sequence[Row], p: Sequence[float], target: float) -> float:
    """The lowest threshold whose precision on ``rows`` reaches ``target`` (with at least
    three alarms); failing that, the one with the best precision."""
    best: tuple[float, float] = (-1.0, 0.5)
    for threshold in sorted({round(q, 6) for q in p}):
        tp, fp, _ = _counts(rows, p, threshold)
        if tp + fp < 3:
            continue
        precision = tp / (tp + fp)
        if precision >= target:
            return threshold
        if precision > best[0]:
            best = (precision, threshold)
    return best[1]


def train(
    rows: Sequence[Row],
    n_scenarios: int,
    *,
    seed: int,
    horizon_s: float,
    lookback_s: float,
    precision_target: float,
    parts: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None,
) -> Trained:
    """A logistic regression on the training scenarios, its threshold from the validation
    ones; ``precision`` is filled in by :func:`evaluate` on the held-out ones."""
    # Imported here, untyped: the lab's other commands and the breaker never need it.
    linear = importlib.import_module("sklearn.linear_model")
    pipelines = importlib.import_module("sklearn.pipeline")
    preprocessing = importlib.import_module("sklearn.preprocessing")
    train_ids, val_ids, held_ids = parts or split(n_scenarios, seed)
    fit = [r for r in rows if r.scenario in train_ids]
    if len({r.y for r in fit}) < 2:
        raise ValueError("the training scenarios hold only one label: generate more scenarios")
    pipeline = pipelines.make_pipeline(
        preprocessing.StandardScaler(),
        linear.LogisticRegression(class_weight="balanced", max_iter=2000),
    )
    pipeline.fit([list(r.x) for r in fit], [r.y for r in fit])
    val = [r for r in rows if r.scenario in val_ids]
    scaler, regression = pipeline[0], pipeline[1]
    model = Model(
        features=FEATURES,
        mean=tuple(float(v) for v in scaler.mean_),
        scale=tuple(float(v) for v in scaler.scale_),
        coef=tuple(float(v) for v in regression.coef_[0]),
        intercept=float(regression.intercept_[0]),
        threshold=0.5,
        horizon_s=horizon_s,
        lookback_s=lookback_s,
        precision=0.0,
    )
    if val:
        p = [model.probability(r.x) for r in val]
        model = attrs.evolve(model, threshold=choose_threshold(val, p, precision_target))
    return Trained(model, train_ids, val_ids, held_ids, pipeline)


def _extra_cost_per_call(recording: Recording) -> float:
    """What one call costs more on the backup line than on the primary (USD)."""
    traffic = recording.scenario.traffic[0]
    chain = recording.scenario.models["chat"]["chain"]
    first, second = chain[0]["price"], chain[1]["price"]
    words = sum(traffic.prompt_words) / 2
    return (
        float(
            words * (second["input"] - first["input"])
            + traffic.max_tokens * (second["output"] - first["output"])
        )
        / 1e6
    )


def evaluate(
    model: Model, rows: Sequence[Row], recordings: Sequence[Recording], ids: Sequence[int],
    suspect_max_inflight: int = 4,
) -> dict[str, Any]:  # fmt: skip
    """Precision, recall, lead time and the false positives' fallback cost on ``ids``."""
    chosen = set(ids)
    held = [r for r in rows if r.scenario in chosen]
    p = [model.probability(r.x) for r in held]
    tp, fp, fn = _counts(held, p, model.threshold)
    alarms = {(r.scenario, r.t) for r, q in zip(held, p, strict=True) if q > model.threshold}
    leads, missed = [], 0
    for i in sorted(chosen):
        recording = recordings[i]
        onsets = _onsets(recording)
        for onset in onsets:
            window = [t for s, t in alarms if s == i and onset - model.horizon_s <= t < onset]
            if window:
                leads.append(onset - min(window))
            else:
                missed += 1
    # A false alarm on the first line makes it suspect: calls beyond its in-flight cap go
    # to the backup. Upper bound: every call of that second does (a circuit opened instead).
    fp_first = [
        r for r, q in zip(held, p, strict=True) if q > model.threshold and not r.y and r.line == 0
    ]
    capped = full = 0.0
    for r in fp_first:
        recording = recordings[r.scenario]
        per_call = _extra_cost_per_call(recording)
        rate = sum(sum(t.rate.values()) for t in recording.scenario.traffic)
        full += rate * per_call
        if r.in_flight > suspect_max_inflight:
            capped += rate * per_call * (r.in_flight - suspect_max_inflight) / r.in_flight
    seconds = sum(recordings[i].scenario.duration_s for i in chosen)
    # For scale: what a rule of thumb on the same moments does, and a random alarm's precision.
    rule = [1.0 if _rule_of_thumb(r.x) else 0.0 for r in held]
    rtp, rfp, rfn = _counts(held, rule, 0.5)
    return {
        "scenarios": len(chosen),
        "rows": len(held),
        "positives": sum(r.y for r in held),
        "threshold": model.threshold,
        "true_alarms": tp,
        "false_alarms": fp,
        "missed": fn,
        "precision": None if tp + fp == 0 else round(tp / (tp + fp), 4),
        "recall": None if tp + fn == 0 else round(tp / (tp + fn), 4),
        "outages": len(leads) + missed,
        "outages_foreseen": len(leads),
        "lead_time_s": None
        if not leads
        else {
            "median": round(statistics.median(leads), 1),
            "min": round(min(leads), 1),
            "max": round(max(leads), 1),
        },
        "base_rate": None if not held else round(sum(r.y for r in held) / len(held), 4),
        "rule_of_thumb": {
            "rule": RULE_OF_THUMB,
            "precision": None if rtp + rfp == 0 else round(rtp / (rtp + rfp), 4),
            "recall": None if rtp + rfn == 0 else round(rtp / (rtp + rfn), 4),
        },
        "false_alarm_first_line_s": len(fp_first),
        "false_alarm_first_line_s_per_hour": round(3600 * len(fp_first) / seconds, 1),
        "false_alarm_cost_usd": {
            "suspect_cap": round(capped, 6),
            "all_to_fallback": round(full, 6),
        },
        "false_alarm_cost_usd_per_hour": {
            "suspect_cap": round(3600 * capped / seconds, 6),
            "all_to_fallback": round(3600 * full / seconds, 6),
        },
    }


RULE_OF_THUMB = "recent 429 share >= 0.3 or recent failure share >= 0.5"
_I429, _IFAIL = FEATURES.index("recent_429_share"), FEATURES.index("recent_failure_share")


def _rule_of_thumb(x: Sequence[float]) -> bool:
    return x[_I429] >= 0.3 or x[_IFAIL] >= 0.5


def _onsets(recording: Recording) -> list[float]:
    """The times (0.25 s grid) at which the chain goes from available to down."""
    out, was = [], False
    steps = math.ceil(recording.scenario.duration_s / 0.25)
    for k in range(steps):
        t = k * 0.25
        down = chain_down(recording.scenario, "chat", t)
        if down and not was:
            out.append(t)
        was = down
    return out


def export(model: Model, held_out: dict[str, Any], trained_on: dict[str, Any]) -> dict[str, Any]:
    """The model file ``[prism:breaker] predictor`` reads (prism_breaker.predictor)."""
    return {
        "format": FORMAT,
        "features": list(model.features),
        "mean": list(model.mean),
        "scale": list(model.scale),
        "coef": list(model.coef),
        "intercept": model.intercept,
        "threshold": model.threshold,
        "horizon_s": model.horizon_s,
        "lookback_s": model.lookback_s,
        "held_out": {**held_out, "precision": held_out["precision"] or 0.0},
        "trained_on": trained_on,
    }
