"""Operators' plugin toggles tell the truth: what loads, what is off, and every mistake named."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from prism_proxy import ConfigError, config_from_mapping, create_app
from prism_proxy.cli import main

MESSAGES = [{"role": "user", "content": "hi"}]


def catalog(line: dict | None = None, **model: object) -> dict:
    return {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x", **(line or {})}], **model}},
    }


def build(core: dict, sections: dict | None = None, data: dict | None = None):
    return create_app(
        config_from_mapping(core, sections, catalog_data=data or catalog(), source="prism.ini")
    )


def test_a_misspelt_disable_stops_start_up():
    with pytest.raises(ConfigError) as info:
        build({"disable": "breakr"})
    assert info.value.key == "[prism] disable"
    assert "no installed plugin is named 'breakr'" in info.value.problem
    assert "breaker" in info.value.problem  # the names that exist


def test_a_section_for_a_plugin_not_installed_is_an_error():
    with pytest.raises(ConfigError) as info:
        build({}, {"breakr": {"state_path": "x.sqlite"}})
    assert info.value.key == "[prism:breakr]"
    assert "no installed plugin is named 'breakr'" in info.value.problem


def test_a_section_for_a_disabled_plugin_is_an_error():
    with pytest.raises(ConfigError) as info:
        build({"disable": "breaker"}, {"breaker": {"consecutive_failures": 2}})
    assert info.value.key == "[prism:breaker]"
    assert "disabled by [prism] disable" in info.value.problem


@pytest.mark.parametrize(
    ("disable", "data", "key", "owner"),
    [
        (
            "billing",
            catalog({"price": {"input": 1, "output": 2}}),
            "models.m.chain[0].price",
            "billing",
        ),
        ("rules", catalog(rules=[]), "models.m.rules", "rules"),
        (
            "anthropic",
            {
                "providers": {"p": {"kind": "anthropic", "base_url": "http://127.0.0.1:9"}},
                "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
            },
            "providers.p.kind",
            "anthropic",
        ),
    ],
)
def test_a_catalog_key_of_a_disabled_plugin_names_the_plugin_and_the_disable(
    disable, data, key, owner
):
    with pytest.raises(ConfigError) as info:
        build({"disable": disable}, data=data)
    assert info.value.key == key
    assert f"it belongs to plugin '{owner}'" in info.value.problem
    assert "[prism] disable in prism.ini turned off" in info.value.problem


async def test_readyz_lists_what_is_loaded_and_what_is_disabled(prism_gateway, prism_fake):
    data = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(data, config={"disable": "rules, keys"})
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/readyz") as response:
            ready = await response.json()
    assert ready["disabled"] == ["keys", "rules"]
    assert "breaker" in ready["plugins"] and "openai" in ready["plugins"]
    assert "rules" not in ready["plugins"] and "keys" not in ready["plugins"]
    # Per-generation objects are not plugins of their own.
    assert "breaker.runtime" not in ready["plugins"]


async def test_load_plugins_loads_only_the_plugins_named(prism_gateway, prism_fake):
    data = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(data, load_plugins=["openai"])
    loaded = gw.gateway.current.loaded()
    assert "openai" in loaded
    assert not {"breaker", "billing", "keys", "rules", "anthropic"} & set(loaded)
    answer = await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content


def write_config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "catalog.toml").write_text(
        '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        "[models.m]\n"
        'chain = [ { provider = "p", model = "x", price = { input = 1, output = 2 } } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(f"[prism]\ncatalog = catalog.toml\ndisable = rules\n{extra}")
    return ini


def test_prism_check_lists_plugins_and_writes_nothing(tmp_path, capsys):
    ini = write_config(
        tmp_path,
        "[prism:breaker]\nstate_path = breaker.sqlite\n"
        "[prism:billing]\nledger_path = ledger.sqlite\n"
        "[prism:keys]\ndb_path = keys.db\n",
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["check", "--config", str(ini)]) == 0
    out = capsys.readouterr().out
    assert "plugins: " in out and "breaker" in out
    assert "rules: disabled by [prism] disable in" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no state file, no ledger


async def test_trace_hooks_logs_every_hook_call(monkeypatch, caplog, prism_fake, prism_gateway):
    monkeypatch.setenv("PRISM_TRACE_HOOKS", "1")
    data = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(data)
    with caplog.at_level(logging.INFO, logger="prism.hooks"):
        await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    traced = [r.getMessage() for r in caplog.records if r.name == "prism.hooks"]
    # Hooks with a single implementation go through pluggy too, and are logged.
    assert any(line.startswith("prism_classify -> prism.default-classify") for line in traced)
    assert any(line.startswith("prism_settle -> ") for line in traced)
    assert any(line == "prism_classify returned Verdict" for line in traced)
