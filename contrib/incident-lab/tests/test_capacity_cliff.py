"""capacity-cliff: an upstream concurrency limit, the capacity rule sampled, k from the peaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prism_lab import ScenarioError, load_scenario
from prism_lab.cli import run
from prism_lab.gatewayconf import write_gateway_config
from prism_lab.report import summarise
from prism_lab.runner import Sample, VariantRun, condition_at
from prism_lab.traffic import Call

SHIPPED = Path(__file__).parents[1] / "scenarios" / "capacity-cliff" / "scenario.toml"

SHORT = """
[scenario]
name = "cliff"
duration_s = 30
time_scale = 0.1
seed = 3

[providers.a]
first_token_ms = 300
token_ms = 10

[providers.b]
first_token_ms = 300
token_ms = 10
concurrency = 4

[models.chat]
chain = [
  { provider = "a", model = "a-1", max_concurrency = 20 },
  { provider = "b", model = "b-1", max_concurrency = 4, queue_ms = 60000 },
]

[traffic]
rate = { chat = 6 }
prompt_words = [5, 20]
max_tokens = 8

[[faults]]
provider = "a"
start_s = 10
end_s = 25
errors = { 500 = 1.0 }

[variants.declared]
metrics = { capacity_k = 1.0 }
billing = false
breaker = { policies = "consecutive" }
"""


def test_the_scenario_takes_a_concurrency_and_the_metrics_plugin(tmp_path):
    scenario = load_scenario(SHIPPED)
    assert scenario.providers["line-b"].concurrency == 12
    assert scenario.providers["line-a"].concurrency is None
    assert condition_at(scenario, "line-b", 0.0, seed=0)["max_concurrency"] == 12
    assert "max_concurrency" not in condition_at(scenario, "line-a", 0.0, seed=0)
    declared = next(v for v in scenario.variants if v.name == "declared")
    ini = write_gateway_config(
        scenario, declared, tmp_path, fake_url="http://x", port=1, replica=0, redis_url=None
    )
    text = ini.read_text()
    assert "[prism:metrics]\ncapacity_window_s = 1800.0\n" in text
    assert "metrics" not in text.split("disable = ")[1].split("\n")[0]
    # The line's queue is a duration like any other: scaled, in whole milliseconds.
    assert "queue_ms = 60000 }" in (tmp_path / "catalog.toml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("concurrency = 12 ", "concurrency = 0 ", "providers.line-b.concurrency"),
        ("metrics = {}", "metrics = 3", "variants.undeclared.metrics"),
    ],
)
def test_a_bad_concurrency_or_metrics_is_refused_naming_the_key(tmp_path, old, new, key):
    path = tmp_path / "bad.toml"
    text = SHIPPED.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.key == key


def _rule(peak_a: int, peak_b: int, ratio: float, firing: bool) -> dict[str, Any]:
    lines = {"a/a-1": {"peak": peak_a, "ratio": ratio}, "b/b-1": {"peak": peak_b}}
    return {
        "k": 1.0,
        "tiers": [{"model": "chat", "lines": lines}],
        "firing": [{"model": "chat", "line": "a/a-1"}] if firing else [],
    }


def test_k_is_the_demand_p99_over_the_lost_line_s_peak(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SHORT)
    scenario = load_scenario(path)
    # One call starts every 0.25 s and takes 1 s unqueued: 4 in flight after the trip.
    calls = [
        Call("chat", False, start_s=i / 4, end_s=i / 4 + 1.0, ok=True, first_token_s=0.5)
        for i in range(120)
    ]
    up = {"a/a-1": {"state": "eligible"}, "b/b-1": {"state": "eligible"}}
    down = {"a/a-1": {"state": "isolated"}, "b/b-1": {"state": "eligible"}}
    samples = [
        Sample(1.0, up, _rule(2, 0, 2.0, False)),
        Sample(3.0, up, _rule(5, 0, 0.8, True)),
        Sample(11.0, down, _rule(5, 1, 0.6, True)),
    ]
    run_ = VariantRun(scenario.variants[0], calls, samples, [], 0)
    capacity = summarise(scenario, run_)["capacity"]
    assert capacity["trip_s"] == 11.0
    assert capacity["alert_s"] == 3.0
    assert capacity["unqueued_call_s"] == 1.0
    assert capacity["demand"]["p99"] == 4
    # (4 - B's peak 0) / A's peak 5, the peaks as the rule held them before the trip.
    assert capacity["k_from_peaks"] == 0.8
    # Ratios 2.0 then 0.8: at k = 0.8 the rule fires only once the ratio is below it.
    assert capacity["alert_s_at_k_from_peaks"] == 11.0
    assert capacity["other_lines_isolated"] is False


async def test_the_rule_fires_before_the_trip_and_the_backup_stays_green(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SHORT)
    [summary] = await run(load_scenario(path), tmp_path / "out")
    capacity = summary["capacity"]
    assert capacity is not None and capacity["lost_line"] == "a/a-1"
    assert capacity["alert_s"] is not None and capacity["alert_s"] < capacity["trip_s"]
    assert capacity["k_from_peaks"] is not None
    assert capacity["other_lines_isolated"] is False
