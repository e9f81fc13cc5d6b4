"""Traffic entries: organisations (keys), caller regions, the Anthropic wire, scheduled rates."""

from __future__ import annotations

from pathlib import Path

import pytest
from prism_lab import ScenarioError, load_scenario
from prism_lab.cli import run
from prism_lab.gatewayconf import write_gateway_config

KINDS = Path(__file__).with_name("kinds.toml")
SHORT = Path(__file__).with_name("short.toml")


def test_entries_carry_org_region_wire_and_a_schedule():
    scenario = load_scenario(KINDS)
    acme, globex, keyless = scenario.traffic
    assert (acme.org, acme.region, acme.wire) == ("acme", None, "openai")
    assert (globex.org, globex.region, globex.wire) == ("globex", "eu-west-1", "anthropic")
    # A schedule is linear between its points, held after the last; its peak is the rate.
    assert keyless.rate["chat"] == 6
    assert [keyless.rate_at("chat", t) for t in (0, 6, 12, 18, 30)] == [0, 3, 6, 3, 0]
    assert acme.rate_at("chat", 5) == 3
    # The old single [traffic] table is still one entry.
    [single] = load_scenario(SHORT).traffic
    assert single.org is None and single.wire == "openai" and not single.schedule


def test_keys_and_regions_are_loaded_only_when_traffic_needs_them(tmp_path):
    scenario = load_scenario(KINDS)
    ini = write_gateway_config(
        scenario, scenario.variants[0], tmp_path, fake_url="http://x", port=1, replica=0,
        redis_url=None,
    )  # fmt: skip
    text = ini.read_text()
    assert "[prism:keys]\ndb_path = keys.db\n" in text
    disabled = text.split("disable = ")[1].split("\n")[0].split(", ")
    assert "keys" not in disabled and "regions" not in disabled
    short = load_scenario(SHORT)
    text = write_gateway_config(
        short, short.variants[0], tmp_path / "s", fake_url="http://x", port=1, replica=0,
        redis_url=None,
    ).read_text()  # fmt: skip
    assert "[prism:keys]" not in text
    disabled = text.split("disable = ")[1].split("\n")[0].split(", ")
    assert "keys" in disabled and "regions" in disabled


BAD = {
    "wire": ('wire = "anthropic"', 'wire = "grpc"', "traffic[1].wire", "must be one of"),
    "org": ('org = "globex"', 'org = "glo bex"', "traffic[1].org", "must be a name"),
    "region": (
        'region = "eu-west-1"\nwire',
        'region = ""\nwire',
        "traffic[1].region",
        "must be a region",
    ),
    "start": (
        "[[0, 0], [12, 6]",
        "[[1, 0], [12, 6]",
        "traffic[2].rate.chat",
        "a schedule starts at t_s = 0",
    ),
    "order": (
        "[12, 6], [24, 0]",
        "[12, 6], [6, 0]",
        "traffic[2].rate.chat",
        "schedule times must rise",
    ),
    "point": ("[24, 0]]", "[24, -1]]", "traffic[2].rate.chat", "schedule points must be"),
    "key": ('org = "acme"', 'org = "acme"\nregions = "x"', "traffic[0].regions", "unknown key"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_traffic_entry_is_refused_naming_file_and_key(tmp_path, case):
    old, new, key, problem = BAD[case]
    text = KINDS.read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{path}: {key}: {problem}")


async def test_every_kind_of_client_is_served_counted_and_billed_to_its_org(tmp_path):
    scenario = load_scenario(KINDS)
    [summary] = await run(scenario, tmp_path)
    kinds = {(k["org"], k["wire"], k["stream"]): k for k in summary["by_traffic"]}
    # Keys were made per organisation; key-less entries carry the lab's own.
    assert set(kinds) == {
        (org, wire, stream)
        for org, wire in (("acme", "openai"), ("globex", "anthropic"), ("lab", "openai"))
        for stream in (False, True)
    }
    for kind in kinds.values():
        assert kind["served"] > 0
    # The unrestricted callers fell over to the US line; globex, kept in the EU,
    # could not, and its calls failed while the EU line did.
    for org in ("acme", "lab"):
        assert kinds[(org, "openai", True)]["served_from_regions"] == ["eu-west-1", "us-east-1"]
        assert kinds[(org, "openai", False)]["failed"] == 0
    for stream in (False, True):
        globex = kinds[("globex", "anthropic", stream)]
        assert globex["served_from_regions"] == ["eu-west-1"]
        assert globex["served_by_fallback"] == 0 and globex["failed"] > 0
    by_org = summary["fallback_extra_cost_by_org"]
    assert by_org["globex"] == 0 and by_org["acme"] > 0 and by_org["lab"] > 0
    assert summary["fallback_extra_cost"] == pytest.approx(sum(by_org.values()))
    # Both wires count alike: the per-kind rows add up to the totals.
    for key in ("calls", "served", "failed", "served_by_fallback"):
        assert sum(k[key] for k in kinds.values()) == summary[key]
    # The key-less rate rises from 0 to 6 at 12 s and back: few calls at the start.
    assert summary["calls"] > 150
