"""``prism-lab predict``: generate, record, label, train, evaluate, and write the model.

Writes into OUT: ``model.json`` (what ``[prism:breaker] predictor`` loads),
``report.json`` (the held-out evaluation, the split, the templates drawn),
``report.txt`` (the same, for people) and ``recordings.json`` (the signals).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .generate import generate
from .learn import evaluate, export, label, train
from .record import record_many, recording_from_json, recording_json

__all__ = ["PredictOptions", "format_report", "predict"]


@attrs.frozen
class PredictOptions:
    scenarios: int = 40
    seed: int = 1
    #: Seconds ahead: the label is "the chain fully unavailable within this long".
    horizon_s: float = 15.0
    #: Seconds back for the recent shares and the latency trend.
    lookback_s: float = 5.0
    duration_s: float = 120.0
    time_scale: float = 0.1
    rate: float = 4.0
    #: The precision the threshold is chosen for (on the validation scenarios).
    precision_target: float = 0.9
    #: Cycle through these templates instead of drawing them (the tests' fixed mix).
    templates: tuple[str, ...] = ()
    #: Scenario indices for (training, validation, held out) instead of a seeded split.
    parts: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
    #: Train on OUT/recordings.json from an earlier run with the same options.
    reuse: bool = False


async def predict(
    options: PredictOptions, out: Path, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Run the whole study; returns the report (also written to OUT)."""
    drawn = generate(
        options.scenarios,
        options.seed,
        duration_s=options.duration_s,
        time_scale=options.time_scale,
        rate=options.rate,
        templates=options.templates,
    )
    out.mkdir(parents=True, exist_ok=True)
    recorded = out / "recordings.json"
    if options.reuse:
        # Same options, same seed: the same scenarios, so their recordings can be reused.
        saved = json.loads(recorded.read_text())
        if len(saved) != len(drawn):
            raise ValueError(f"{recorded}: {len(saved)} recordings, {len(drawn)} scenarios drawn")
        recordings = [
            recording_from_json(data, template, scenario)
            for data, (template, scenario) in zip(saved, drawn, strict=True)
        ]
    else:
        recordings = await record_many(drawn, out / "runs", progress)
        recorded.write_text(json.dumps([recording_json(r) for r in recordings]))
    rows = label(recordings, options.horizon_s, options.lookback_s)
    trained = train(
        rows,
        len(recordings),
        seed=options.seed,
        horizon_s=options.horizon_s,
        lookback_s=options.lookback_s,
        precision_target=options.precision_target,
        parts=options.parts,
    )
    held_out = evaluate(trained.model, rows, recordings, trained.held_out)
    model = attrs.evolve(trained.model, precision=held_out["precision"] or 0.0)
    templates = collections.Counter(t for t, _ in drawn)
    trained_on = {
        "scenarios": len(recordings),
        "seed": options.seed,
        "duration_s": options.duration_s,
        "time_scale": options.time_scale,
        "rate": options.rate,
        "templates": dict(sorted(templates.items())),
        "split": {
            "train": list(trained.train),
            "validation": list(trained.validation),
            "held_out": list(trained.held_out),
        },
        "rows": len(rows),
        "positives": sum(r.y for r in rows),
    }
    document = export(model, held_out, trained_on)
    (out / "model.json").write_text(json.dumps(document, indent=2) + "\n")
    report = {"held_out": held_out, "trained_on": trained_on, "model": str(out / "model.json")}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.txt").write_text(format_report(report) + "\n")
    return report


def format_report(report: dict[str, Any]) -> str:
    h, t = report["held_out"], report["trained_on"]
    lead = h["lead_time_s"]
    cost = h["false_alarm_cost_usd_per_hour"]
    lines = [
        f"scenarios: {t['scenarios']} ({', '.join(f'{k} {v}' for k, v in t['templates'].items())})",
        f"moments: {t['rows']} ({t['positives']} before an outage); held out: "
        f"{h['scenarios']} scenarios, {h['rows']} moments, {h['positives']} positive",
        f"threshold {h['threshold']:.3f}: precision {h['precision']}, recall {h['recall']} "
        f"({h['true_alarms']} true, {h['false_alarms']} false alarms, {h['missed']} missed)",
        f"base rate {h['base_rate']}; rule of thumb ({h['rule_of_thumb']['rule']}): precision "
        f"{h['rule_of_thumb']['precision']}, recall {h['rule_of_thumb']['recall']}",
        f"outages foreseen: {h['outages_foreseen']} of {h['outages']}; lead time (s): "
        + ("none" if lead is None else f"median {lead['median']} ({lead['min']}..{lead['max']})"),
        f"false alarms on the first line: {h['false_alarm_first_line_s']} s "
        f"({h['false_alarm_first_line_s_per_hour']} s per hour); fallback cost per hour "
        f"(USD, at the scenarios' traffic): {cost['suspect_cap']} under the suspect cap, "
        f"{cost['all_to_fallback']} had every call moved",
        f"model: {report['model']}",
    ]
    return "\n".join(lines)
