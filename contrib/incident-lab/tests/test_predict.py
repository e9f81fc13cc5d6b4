"""``prism-lab predict`` on a tiny generated set: real gateways, real labels, a real model.

Three short scenarios (two cascades and a quiet one) are recorded through
real ``prism serve`` processes and the fake upstream; the model is trained
on two and judged on the third. What is checked is the pipeline, not the
quality of a model trained on three incidents: labels that follow the
timeline, a model file the breaker loads, the breaker's arithmetic agreeing
with scikit-learn's, and an evaluation that counts what it says.
"""

from __future__ import annotations

import json

import pytest
from prism_breaker.predictor import FEATURES, load_model
from prism_lab.cli import main
from prism_lab.generate import chain_down, generate, line_down
from prism_lab.learn import evaluate, label, train
from prism_lab.predict import PredictOptions, predict
from prism_lab.record import recording_from_json
from prism_lab.scenario import Fault

TINY = PredictOptions(
    scenarios=3,
    seed=5,
    duration_s=30.0,
    time_scale=0.1,
    rate=2.0,
    horizon_s=10.0,
    templates=("cascade", "quiet", "cascade"),
    parts=((0, 1), (), (2,)),
)


async def test_a_tiny_generated_set_is_recorded_labelled_trained_and_evaluated(tmp_path):
    report = await predict(TINY, tmp_path)

    drawn = generate(3, 5, duration_s=30.0, time_scale=0.1, rate=2.0, templates=TINY.templates)
    saved = json.loads((tmp_path / "recordings.json").read_text())
    recordings = [recording_from_json(d, t, s) for d, (t, s) in zip(saved, drawn, strict=True)]
    # Every scenario was sampled about once a scenario second, both lines of the chain.
    for recording in recordings:
        assert set(recording.bindings) == {"primary/p-1", "backup/b-1"}
        assert len(recording.bindings["primary/p-1"]) >= 20

    rows = label(recordings, TINY.horizon_s, TINY.lookback_s)
    # A moment is positive exactly when the chain goes down within the horizon after it.
    for row in rows:
        scenario = recordings[row.scenario].scenario
        assert not chain_down(scenario, "chat", row.t)
        later = [row.t + k * 0.25 for k in range(1, 41)]
        assert row.y == any(chain_down(scenario, "chat", u) for u in later)
    assert not any(r.y for r in rows if r.scenario == 1)  # quiet: nothing to foresee
    assert any(r.y for r in rows if r.scenario == 0)

    # The exported model is what the breaker loads, and its arithmetic is scikit-learn's.
    model = load_model(tmp_path / "model.json")
    assert model.features == FEATURES
    assert (model.horizon_s, model.lookback_s) == (10.0, 5.0)
    assert model.precision == (report["held_out"]["precision"] or 0.0)
    trained = train(
        rows, 3, seed=5, horizon_s=10.0, lookback_s=5.0, precision_target=0.9, parts=TINY.parts
    )
    assert trained.model.coef == pytest.approx(model.coef)
    sklearn_p = trained.pipeline.predict_proba([list(r.x) for r in rows])[:, 1]
    assert [model.probability(r.x) for r in rows] == pytest.approx(list(sklearn_p), abs=1e-9)

    # The held-out verdict counts the held-out scenario's moments and its one outage.
    held = report["held_out"]
    assert held == evaluate(model, rows, recordings, (2,))
    assert held["rows"] == sum(r.scenario == 2 for r in rows)
    assert held["true_alarms"] + held["missed"] == held["positives"] > 0
    assert held["outages"] == 1
    assert held["outages_foreseen"] == (held["lead_time_s"] is not None)
    assert (tmp_path / "report.txt").read_text().startswith("scenarios: 3 (cascade 2, quiet 1)")


def _share(fault: Fault) -> float:
    return fault.refused + fault.rate_limited + sum(fault.errors.values())


def test_the_ground_truth_follows_the_timeline():
    [(template, scenario)] = generate(1, 2, duration_s=100.0, templates=("cascade",))
    assert template == "cascade"
    [primary_down, backup_down] = [f for f in scenario.faults if _share(f) >= 1.0]
    assert (primary_down.provider, backup_down.provider) == ("primary", "backup")
    assert primary_down.start_s < backup_down.start_s < backup_down.end_s <= 100.0
    t = (primary_down.start_s + backup_down.start_s) / 2
    assert line_down(scenario, "primary", t) and not line_down(scenario, "backup", t)
    assert not chain_down(scenario, "chat", t)
    assert chain_down(scenario, "chat", backup_down.start_s + 0.1)


def test_the_command_refuses_too_few_scenarios(tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--out", str(tmp_path), "--scenarios", "2"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == (
        "prism-lab: predict: --scenarios must be at least 4 (training, validation and held out)\n"
    )
    assert not (tmp_path / "model.json").exists()
