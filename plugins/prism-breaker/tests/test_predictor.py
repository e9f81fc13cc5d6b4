"""The opt-in predictor (``[prism:breaker] predictor``) through a real gateway.

The model files are written here, by hand: one that reads "a binding whose
recent attempts were mostly 429s is about to leave its chain unavailable".
429s never count against a binding, so without the predictor the binding
stays eligible; with it, it turns suspect (and never isolated), and a model
whose held-out precision is below the floor is ignored, with one warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prism_breaker.predictor import FEATURES, FORMAT, History, load_model, signals_from_health
from prism_fake_upstream import Fault

from prism_proxy import ConfigError

BINDING = "flaky/up-flaky"


def model_file(tmp_path: Path, *, precision: float, **changes: Any) -> Path:
    coef = [0.0] * len(FEATURES)
    coef[FEATURES.index("recent_429_share")] = 20.0
    document = {
        "format": FORMAT,
        "features": list(FEATURES),
        "mean": [0.0] * len(FEATURES),
        "scale": [1.0] * len(FEATURES),
        "coef": coef,
        "intercept": -5.0,  # above one half once more than a quarter of recent attempts are 429s
        "threshold": 0.5,
        "horizon_s": 15,
        "lookback_s": 5,
        "held_out": {"precision": precision, "recall": 0.4},
        **changes,
    }
    path = tmp_path / "model.json"
    path.write_text(json.dumps(document))
    return path


async def _start(prism_gateway: Any, kit: Any, fake_time: Any, **breaker: Any) -> Any:
    return await prism_gateway(
        kit.catalog("flaky", "steady", retries=0),
        sections={"breaker": {"policies": "consecutive, error_rate", **breaker}},
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    )


async def _rate_limited_then_answered(prism_fake: Any, kit: Any, gw: Any) -> None:
    """Three calls meet a 429 on the first line (served by the second), the fourth does not."""
    prism_fake.script("flaky", [Fault(status=429, headers={"retry-after": "1"})] * 3)
    for _ in range(3):
        assert (await kit.chat(gw)).provider == "steady"
    assert (await kit.chat(gw)).provider == "flaky"


async def test_a_model_over_the_floor_makes_a_binding_suspect_never_isolated(
    prism_fake, prism_gateway, kit, fake_time, tmp_path
):
    gw = await _start(
        prism_gateway, kit, fake_time, predictor=str(model_file(tmp_path, precision=0.95))
    )
    await _rate_limited_then_answered(prism_fake, kit, gw)
    entry = await kit.binding(gw, BINDING)
    assert entry["state"] == "suspect"
    assert entry["cause"] == (
        "predictor: 100% chance the chain is unavailable within 15 s (threshold 50%)"
    )
    # The features the lab computes from this very entry are the ones that tripped it.
    x = History(5).add(signals_from_health(entry, 0.0))
    assert x[FEATURES.index("recent_429_share")] == 0.75
    assert load_model(model_file(tmp_path, precision=0.95)).probability(x) > 0.99

    # More of the same never isolates it: the predictor only ever suspects.
    fake_time.advance(2)
    prism_fake.script("flaky", [Fault(status=429)] * 6)
    for _ in range(6):
        await kit.chat(gw)
    fake_time.advance(2)
    await kit.chat(gw)
    assert (await kit.binding(gw, BINDING))["state"] == "suspect"

    # Once the 429s are older than the lookback, the next answers clear the suspicion.
    fake_time.advance(10)
    await kit.chat(gw)  # the history's "before" moves past the 429s
    fake_time.advance(2)
    answer = await kit.chat(gw)
    assert answer.provider == "flaky"
    entry = await kit.binding(gw, BINDING)
    assert (entry["state"], entry["cause"]) == ("eligible", "evidence cleared")


async def test_without_the_predictor_the_same_429s_leave_the_binding_eligible(
    prism_fake, prism_gateway, kit, fake_time
):
    gw = await _start(prism_gateway, kit, fake_time)
    await _rate_limited_then_answered(prism_fake, kit, gw)
    assert (await kit.binding(gw, BINDING))["state"] == "eligible"


async def test_a_model_below_the_precision_floor_is_ignored_and_said_so_once(
    prism_fake, prism_gateway, kit, fake_time, tmp_path, caplog
):
    path = model_file(tmp_path, precision=0.6)
    with caplog.at_level(logging.WARNING, logger="prism.breaker"):
        gw = await _start(prism_gateway, kit, fake_time, predictor=str(path))
        await _rate_limited_then_answered(prism_fake, kit, gw)
    assert (await kit.binding(gw, BINDING))["state"] == "eligible"
    warnings = [r.getMessage() for r in caplog.records if "predictor" in r.getMessage()]
    assert warnings == [
        f"<test config>: [prism:breaker] predictor: {path}: not used: its held-out precision "
        "0.600 is below predictor_precision_floor 0.900 (a suspicion it raised would more "
        "often be wrong than the floor allows)"
    ]


async def test_a_lower_floor_admits_the_same_model(
    prism_fake, prism_gateway, kit, fake_time, tmp_path
):
    path = model_file(tmp_path, precision=0.6)
    gw = await _start(
        prism_gateway, kit, fake_time, predictor=str(path), predictor_precision_floor=0.5
    )
    await _rate_limited_then_answered(prism_fake, kit, gw)
    assert (await kit.binding(gw, BINDING))["state"] == "suspect"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"format": "other/1"}, "format: expected 'prism-breaker-predictor/1'"),
        ({"features": ["error_rate"]}, "features: expected ['error_rate', 'consecutive'"),
        ({"coef": [1.0, 2.0]}, "coef: expected a list of 9 numbers"),
        ({"threshold": 2}, "threshold: expected a number from 0 to 1, got 2"),
        ({"held_out": None}, "held_out: expected the held-out evaluation"),
    ],
)
async def test_a_malformed_model_stops_start_up_naming_the_problem(
    prism_gateway, kit, fake_time, tmp_path, changes, problem
):
    path = model_file(tmp_path, precision=0.95, **changes)
    with pytest.raises(ConfigError) as caught:
        await _start(prism_gateway, kit, fake_time, predictor=str(path))
    assert f"[prism:breaker] predictor: {path}: {problem}" in str(caught.value)
