"""The organisation setting, ``[prism:regions]``, start-up checks and where the hooks sit."""

from __future__ import annotations

import logging

import pytest
from prism_regions import POLICY_NAME, SETTING, parse_regions, policy_of, regions_of

from prism_proxy import ConfigError


def test_the_setting_parses_a_comma_list():
    assert parse_regions("eu-west-1,eu-central-1") == frozenset({"eu-west-1", "eu-central-1"})
    assert parse_regions(" eu-west-1 , europe-west4,, westeurope ") == frozenset(
        {"eu-west-1", "europe-west4", "westeurope"}
    )
    assert parse_regions("eu-west-1,eu-west-1") == frozenset({"eu-west-1"})
    # Empty: unrestricted.
    assert parse_regions("") == frozenset()
    assert parse_regions("  ") == frozenset()


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("EU-WEST-1", "'EU-WEST-1'"),
        ("eu-west-1,eu_central_1", "'eu_central_1'"),
        ("eu-west-1,us--east", "'us--east'"),
        ("1eu", "'1eu'"),
        ("eu west", "'eu west'"),
        ("a" * 65, "'" + "a" * 64 + "'"),
    ],
)
def test_the_setting_names_a_bad_region(text, bad):
    with pytest.raises(ValueError) as caught:
        parse_regions(text)
    assert bad in str(caught.value)
    assert "is not a region name" in str(caught.value)


def test_what_an_auth_plugin_hands_over_is_read_strictly():
    assert regions_of(None) is None
    assert regions_of(frozenset()) is None  # empty: unrestricted
    assert regions_of("") is None
    assert regions_of(frozenset({"eu-west-1"})) == frozenset({"eu-west-1"})
    assert regions_of("eu-west-1, eu-central-1") == frozenset({"eu-west-1", "eu-central-1"})
    assert regions_of(["eu-west-1"]) == frozenset({"eu-west-1"})
    for unreadable in (42, frozenset({"EU"}), [1], b"eu-west-1"):
        with pytest.raises(ValueError):
            regions_of(unreadable)


async def test_the_setting_is_declared(kit, start):
    gw = await start(kit.catalog("eu"))
    declared = gw.gateway.current.org_settings[SETTING]
    assert declared.name == "regions"
    assert declared.parse is parse_regions
    assert "comma-separated regions" in declared.help


async def test_the_policy_is_the_outermost_route_wrapper_and_vetoes_first(kit, start):
    # Loaded with the other route wrappers (breaker, scoring) and the rules.
    cat = kit.catalog("eu", "us")
    cat["models"]["m"]["chain"] = [
        {"provider": "eu", "model": "up-eu", "group": "g"},
        {"provider": "us", "model": "up-us", "group": "g"},
    ]
    gw = await start(cat, plugins=["breaker", "rules", "scoring"])
    hooks = gw.gateway.current.pm.hook
    # pluggy calls implementations last to first: the last wrapper is the outermost,
    # the last plain implementation of a first-result hook is asked first.
    wrappers = [i for i in hooks.prism_select_route.get_hookimpls() if i.wrapper]
    assert [i.plugin_name for i in wrappers][-1] == POLICY_NAME
    assert {i.plugin_name for i in wrappers} >= {"breaker.runtime", "scoring.order"}
    assert hooks.prism_admit_attempt.get_hookimpls()[-1].plugin_name == POLICY_NAME


@pytest.mark.parametrize(
    ("values", "key", "problem"),
    [
        ({"defaults": "eu-west-1"}, "[prism:regions] defaults", "unknown key"),
        ({"default": "EU"}, "[prism:regions] default", "'EU' is not a region name"),
        ({"default": "eu-west-1,eu_west_2"}, "[prism:regions] default", "'eu_west_2'"),
        ({"default": ["eu-west-1", "Frankfurt"]}, "[prism:regions] default", "'Frankfurt'"),
        ({"default": 3}, "[prism:regions] default", "expected a list"),
    ],
)
async def test_setting_mistakes_stop_start_up(kit, start, values, key, problem):
    with pytest.raises(ConfigError) as caught:
        await start(kit.catalog("eu"), sections={"regions": values})
    assert caught.value.key == key
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("value", "default"),
    [
        ("eu-west-1, eu-central-1", frozenset({"eu-west-1", "eu-central-1"})),
        (["eu-west-1"], frozenset({"eu-west-1"})),  # a TOML array
        ("", None),  # empty: unrestricted
    ],
)
async def test_the_default_is_read(kit, start, value, default):
    gw = await start(kit.catalog("eu", "de"), sections={"regions": {"default": value}})
    policy = policy_of(gw.gateway.current)
    assert policy is not None and policy.default == default


async def test_a_default_region_nothing_serves_is_a_warning(kit, start, caplog):
    caplog.set_level(logging.WARNING, logger="prism.regions")
    gw = await start(
        kit.catalog("us", "eu"), sections={"regions": {"default": "eu-west-1,eu-north-1"}}
    )
    (record,) = [r for r in caplog.records if r.name == "prism.regions"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "[prism:regions] default names eu-north-1" in message
    assert "served from eu-west-1 only" in message
    # Not an error: the gateway serves.
    assert (await kit.chat(gw)).provider == "eu"


async def test_a_default_nothing_serves_at_all_warns_of_the_503s(kit, start, caplog, prism_fake):
    caplog.set_level(logging.WARNING, logger="prism.regions")
    gw = await start(kit.catalog("us"), sections={"regions": {"default": "eu-north-1"}})
    (record,) = [r for r in caplog.records if r.name == "prism.regions"]
    assert "get 503 for every model" in record.getMessage()
    answer = await kit.chat(gw)
    assert answer.status == 503 and answer.code == "no_binding_available"
    assert prism_fake.hits("us") == 0


async def test_regions_served_only_by_rule_lines_or_line_options_count(kit, start, caplog):
    caplog.set_level(logging.WARNING, logger="prism.regions")
    cat = kit.catalog("us")
    cat["models"]["m"]["chain"].append({"provider": "plain", "model": "x", "region": "eu-south-1"})
    cat["models"]["m"]["rules"] = [
        {
            "name": "nordic",
            "when": {"org.name": "sami"},
            "chain": [{"provider": "de", "model": "y"}],
        }
    ]
    await start(
        cat, plugins=["rules"], sections={"regions": {"default": "eu-south-1,eu-central-1"}}
    )
    assert [r for r in caplog.records if r.name == "prism.regions"] == []


def test_org_regions_warns_of_a_region_no_line_serves(tmp_path, capsys):
    """prism keys org-regions checks the value against the catalog: said, not refused."""
    from prism_proxy.cli import main
    from prism_proxy.testing import installed_plugins

    others = sorted(set(installed_plugins()) - {"keys", "openai", "regions"})
    (tmp_path / "prism.ini").write_text(
        f"[prism]\ncatalog = catalog.toml\ndisable = {', '.join(others)}\n"
        "[prism:keys]\ndb_path = keys.db\n"
    )
    (tmp_path / "catalog.toml").write_text(
        '[providers.eu]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'region = "eu-west-1"\n'
        '[models.m]\nchain = [{ provider = "eu", model = "up" }]\n'
    )
    ini = str(tmp_path / "prism.ini")
    assert main(["keys", "create", "--org", "acme", "--scopes", "chat", "--config", ini]) == 0
    capsys.readouterr()
    status = main(["keys", "org-regions", "acme", "--set", "eu-west-1,eu-north-1", "--config", ini])
    err = capsys.readouterr().err
    assert status == 0
    assert "warning: regions: no line of" in err and "serves from eu-north-1" in err
    assert "eu-west-1" not in err.split("serves from", 1)[1]
