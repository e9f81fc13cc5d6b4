"""Regions as a fact of the catalog: every line knows where it serves from; answers say it."""

from __future__ import annotations

import logging

import pytest

from prism_proxy import ConfigError, OrgSetting, config_from_mapping, create_app, hookimpl

HI = [{"role": "user", "content": "hi"}]


def catalog(fake, provider_region: str | None = None, line: dict | None = None) -> dict:
    provider = {"kind": "openai", "base_url": fake.base_url("ok")}
    if provider_region is not None:
        provider["region"] = provider_region
    return {
        "providers": {"p": provider},
        "models": {"m": {"chain": [{"provider": "p", "model": "up", **(line or {})}]}},
    }


async def test_a_line_takes_its_providers_region_and_answers_say_it(
    prism_fake, prism_gateway, caplog
):
    gw = await prism_gateway(catalog(prism_fake, "eu-west-1"), load_plugins=["openai"])
    binding = gw.gateway.current.catalog.models["m"].chain[0]
    assert binding.region == "eu-west-1"
    # The provider's options stay the kind's own: region is not one of them.
    assert "region" not in gw.gateway.current.catalog.providers["p"].options
    with caplog.at_level(logging.INFO, logger="prism.calls"):
        raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
    assert raw.headers["x-prism-region"] == "eu-west-1"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "prism.calls"]
    assert "region=eu-west-1" in line


async def test_a_line_overrides_its_providers_region(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, "eu-west-1", {"region": "eu-central-1"}), load_plugins=["openai"]
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
    assert raw.headers["x-prism-region"] == "eu-central-1"


async def test_no_region_no_header(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake), load_plugins=["openai"])
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
    assert "x-prism-region" not in raw.headers


@pytest.mark.parametrize(
    ("provider_region", "line", "key"),
    [
        ("EU West", None, "providers.p.region"),
        (None, {"region": "eu_west_1"}, "models.m.chain[0].region"),
        (None, {"region": 7}, "models.m.chain[0].region"),
    ],
)
def test_a_region_name_that_is_not_one_stops_start_up(prism_fake, provider_region, line, key):
    with pytest.raises(ConfigError) as info:
        create_app(config_from_mapping({}, catalog_data=catalog(prism_fake, provider_region, line)))
    assert info.value.key == key
    assert "region name" in info.value.problem


class DeclaresBudget:
    # Not ``budget``: prism-limits, installed beside the core, declares that one.
    def __init__(self, name: str = "daily_budget") -> None:
        self.name = name

    @hookimpl
    def prism_org_settings(self):
        return [OrgSetting(self.name, float, "a daily budget")]


def test_organisation_settings_are_collected_and_a_clash_names_both(prism_fake):
    app = create_app(
        config_from_mapping({}, catalog_data=catalog(prism_fake)),
        plugins=[(DeclaresBudget(), "budget-a")],
    )
    from prism_proxy import GATEWAY

    settings = app[GATEWAY].current.org_settings
    assert settings["daily_budget"].parse("2.5") == 2.5
    with pytest.raises(ConfigError) as info:
        create_app(
            config_from_mapping({}, catalog_data=catalog(prism_fake)),
            plugins=[(DeclaresBudget(), "budget-a"), (DeclaresBudget(), "budget-b")],
        )
    assert "'budget-a' and 'budget-b' both declare the organisation setting 'daily_budget'" in str(
        info.value
    )
