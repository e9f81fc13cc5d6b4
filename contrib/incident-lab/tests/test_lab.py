"""The lab end to end: a short time-scaled incident through real `prism serve` and fake upstream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prism_lab import ScenarioError, load_scenario
from prism_lab.cli import main, run
from prism_lab.procs import LabError

SHORT = Path(__file__).with_name("short.toml")
SHIPPED = sorted((Path(__file__).parents[1] / "scenarios").glob("*/scenario.toml"))


async def test_short_outage_is_isolated_and_served_by_fallback(tmp_path, capsys):
    scenario = load_scenario(SHORT)
    [summary] = await run(scenario, tmp_path)

    # Every call was answered: the primary's 503s fell over to the backup line.
    assert summary["calls"] > 100
    assert summary["failed"] == 0
    assert summary["served"] == summary["calls"]
    assert summary["served_by_fallback"] > 20
    # The breaker isolated the primary within a few scenario seconds of the onset,
    # so only a handful of calls reached it while it was sick (10 s at 5 calls/s).
    [fault] = summary["faults"]
    assert fault["binding"] == "primary/fast"
    assert fault["isolated_after_s"] is not None and fault["isolated_after_s"] < 5
    assert fault["full_traffic_after_end_s"] is not None
    assert 3 <= summary["calls_to_sick_bindings"] < 15
    assert fault["isolations"] == 1
    # The backup is dearer: its answers cost more than the primary's would have.
    assert summary["fallback_extra_cost"] > 0

    out = tmp_path / "breaker"
    timeline = json.loads((out / "timeline.json").read_text())
    assert len(timeline) >= scenario.duration_s
    states = [row["breaker"]["primary/fast"] for row in timeline]
    assert states[5] == "eligible" and states[15] == "isolated" and states[-1] == "eligible"
    assert (out / "timeline.csv").read_text().startswith("t,served,served_by_fallback,")
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "summary.json").read_text()) == summary

    main(["compare", str(tmp_path)])
    table = capsys.readouterr().out
    assert "short-outage/breaker" in table
    assert "primary/fast [10-20s] isolated after (s)" in table


async def test_a_scale_below_a_gateway_floor_is_refused_naming_the_setting(tmp_path):
    path = tmp_path / "fast.toml"
    path.write_text(SHORT.read_text().replace("time_scale = 0.1", "time_scale = 0.01"))
    with pytest.raises(LabError) as caught:
        await run(load_scenario(path), tmp_path / "out")
    message = str(caught.value)
    assert message.startswith("variant breaker (durations scaled by 0.01): gateway0: ")
    assert "[prism] attempt_timeout_ms: must be at least 1000, got 600" in message


BAD = {
    "unknown fault key": (
        '[[faults]]\nprovider = "primary"\nstart_s = 1\nend_s = 2\nlatency = 5\n',
        "faults[1].latency: unknown key",
    ),
    "unknown provider": (
        '[[faults]]\nprovider = "nobody"\nstart_s = 1\nend_s = 2\n',
        "faults[1].provider: unknown provider 'nobody'",
    ),
    "end before start": (
        '[[faults]]\nprovider = "primary"\nstart_s = 5\nend_s = 2\n',
        "faults[1].end_s: must be after start_s",
    ),
    "shares over one": (
        '[[faults]]\nprovider = "primary"\nstart_s = 1\nend_s = 2\n'
        "errors = { 503 = 0.8 }\nrate_limited = 0.5\n",
        "faults[1].errors: errors, rate_limited, refused, empty and cut add up to 1.3",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_scenario_is_refused_naming_file_and_key(tmp_path, case):
    extra, expected = BAD[case]
    path = tmp_path / "bad.toml"
    path.write_text(SHORT.read_text() + extra)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(f"{path}: {expected}")


def test_the_command_refuses_a_malformed_scenario_with_a_non_zero_exit(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(SHORT.read_text().replace("rate = { chat = 5 }", "rate = { chta = 5 }"))
    done = subprocess.run(
        [sys.executable, "-m", "prism_lab.cli", "run", str(path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == f"prism-lab: {path}: traffic.rate.chta: unknown model (known: chat)\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name)
def test_every_shipped_scenario_loads(path):
    assert load_scenario(path).variants
