"""Organisation settings: declared by plugins, set with `prism keys org-set`, on the principal."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import prism_keys.cli_settings
import pytest
from prism_keys import KeyStore, ring_of
from prism_keys.store import SCHEMA_VERSION

from prism_proxy import Call, OrgSetting, hookimpl, is_region
from prism_proxy.cli import main
from prism_proxy.plugins import make_plugin_manager, org_settings
from prism_proxy.testing import installed_plugins

MESSAGES = [{"role": "user", "content": "hello"}]
REGIONS_HELP = "regions the organisation's calls may be served from (empty: any)"
BUDGET_HELP = "a daily budget, at most the plugin's limit"
#: Registered under the name prism-regions has, so that it stands in for it
#: (the installed plugin of that name, if any, is then not loaded twice).
PLUGIN_NAME = "regions"


class DeclaresSettings:
    """Declares `regions` (as prism-regions does) and `test_budget`; records what hooks see."""

    def __init__(self, budget_limit: float = 100.0) -> None:
        self.budget_limit = budget_limit
        self.parsed: list[str] = []
        self.seen: list[Mapping[str, Any]] = []

    @hookimpl
    def prism_org_settings(self) -> list[OrgSetting]:
        limit = self.budget_limit  # fixed when declared, as a plugin's parser would be

        def regions(text: str) -> frozenset[str]:
            self.parsed.append("regions")
            names = frozenset(part.strip() for part in text.split(",") if part.strip())
            for name in sorted(names):
                if not is_region(name):
                    raise ValueError(f"{name!r} is not a region name")
            return names

        def budget(text: str) -> float:
            self.parsed.append("test_budget")
            value = float(text)
            if not 0 <= value <= limit:
                raise ValueError(f"must be between 0 and {limit:g}")
            return value

        return [
            OrgSetting("regions", regions, REGIONS_HELP),
            OrgSetting("test_budget", budget, BUDGET_HELP),
        ]

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        self.seen.append(call.principal.settings)


class DeclaresNothing:
    """Takes the name `regions`, so that no installed prism-regions declares it."""


def cli_plugins(monkeypatch: pytest.MonkeyPatch, plugin: object) -> None:
    """The plugins `prism keys` loads for its declarations: the installed ones and ``plugin``."""
    monkeypatch.setattr(
        prism_keys.cli_settings,
        "declared_org_settings",
        lambda config: org_settings(
            config, make_plugin_manager(config, extra_plugins=[(plugin, PLUGIN_NAME)])
        ),
    )


@pytest.fixture
def declares(monkeypatch: pytest.MonkeyPatch) -> DeclaresSettings:
    plugin = DeclaresSettings()
    cli_plugins(monkeypatch, plugin)
    return plugin


@pytest.fixture
def ini(tmp_path: Path) -> Path:
    # Like the gateway's load_plugins: only keys, openai and the test's own plugin,
    # whatever else is installed (and declares settings of its own).
    others = sorted(set(installed_plugins()) - {"keys", "openai", PLUGIN_NAME})
    disable = f"disable = {', '.join(others)}\n" if others else ""
    path = tmp_path / "prism.ini"
    path.write_text(
        f"[prism]\ncatalog = catalog.toml\n{disable}\n[prism:keys]\ndb_path = keys.db\n"
    )
    (tmp_path / "catalog.toml").write_text(
        '[providers.alpha]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n\n'
        '[models.chat-a]\nchain = [{ provider = "alpha", model = "up" }]\n'
    )
    return path


def keys_cli(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["keys", *args, "--config", str(ini)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def create_key(ini: Path, capsys: pytest.CaptureFixture[str], org: str) -> str:
    status, out, err = keys_cli(ini, capsys, "create", "--org", org, "--scopes", "chat,model:*")
    assert status == 0, err
    return out.rstrip("\n").splitlines()[-1]


# --- the command line ---


def test_org_set_refuses_undeclared_names_and_values_the_declaration_refuses(ini, capsys, declares):
    create_key(ini, capsys, "acme")

    status, out, err = keys_cli(ini, capsys, "org-set", "acme", "regoins=eu-west-1")
    assert status == 2 and out == ""
    assert err.count("\n") == 1  # one line
    assert "unknown organisation setting 'regoins'" in err
    assert f"declared: regions ({REGIONS_HELP}), test_budget ({BUDGET_HELP})" in err

    status, _, err = keys_cli(ini, capsys, "org-set", "acme", "test_budget=lots")
    assert status == 2
    assert "invalid value for test_budget: could not convert string to float: 'lots'" in err
    status, _, err = keys_cli(ini, capsys, "org-set", "acme", "regions=eu-west-1,EU West")
    assert status == 2 and "invalid value for regions: 'EU West' is not a region name" in err
    status, _, err = keys_cli(ini, capsys, "org-set", "acme", "regions")
    assert status == 2 and "expected NAME=VALUE, got 'regions'" in err
    status, _, err = keys_cli(ini, capsys, "org-set", "acme")
    assert status == 2 and "nothing to do" in err

    # All or nothing: one bad value and the good one is not written either.
    status, _, err = keys_cli(ini, capsys, "org-set", "acme", "regions=eu-west-1", "test_budget=-1")
    assert status == 2 and "invalid value for test_budget: must be between 0 and 100" in err
    assert KeyStore(ini.parent / "keys.db").org_settings("acme") == {}

    # Organisations are made by `create` (or `org-tags --set`), not by a setting.
    status, _, err = keys_cli(ini, capsys, "org-set", "nobody", "regions=eu-west-1")
    assert status == 1 and "unknown organisation 'nobody'" in err
    status, _, err = keys_cli(ini, capsys, "org-set", "bad org", "regions=eu-west-1")
    assert status == 1 and "invalid organisation 'bad org'" in err
    status, _, err = keys_cli(ini, capsys, "org-show", "nobody")
    assert status == 1 and "unknown organisation 'nobody'" in err


def test_org_set_sets_and_unsets_and_org_show_says_what_is_declared(ini, capsys, declares):
    create_key(ini, capsys, "acme")
    store = KeyStore(ini.parent / "keys.db")
    before = store.revision()

    status, out, _ = keys_cli(
        ini, capsys, "org-set", "acme", "regions=eu-west-1,eu-central-1", "test_budget=12.5"
    )
    assert status == 0
    assert out.splitlines() == [
        "acme: regions = eu-west-1,eu-central-1",
        "acme: test_budget = 12.5",
        "running gateways apply it within 5 s",
    ]
    assert store.org_settings("acme") == {
        "regions": "eu-west-1,eu-central-1",
        "test_budget": "12.5",
    }
    assert store.revision() == before + 1  # one transaction, one revision

    # A setting some plugin no longer loaded declared, and one that no longer parses.
    store.update_org_settings("acme", {"legacy_cap": "7", "test_budget": "250"})
    status, out, _ = keys_cli(ini, capsys, "org-show", "acme")
    assert status == 0
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["setting", "value", "status"]
    assert ["legacy_cap", "7", "declared", "by", "no", "loaded", "plugin:", "ignored"] in lines
    assert ["regions", "eu-west-1,eu-central-1", "ok"] in lines
    assert "does not parse, left out: must be between 0 and 100" in out
    assert ["test_budget", "250", "does", "not", "parse,"] in [line[:5] for line in lines]

    status, out, _ = keys_cli(
        ini, capsys, "org-set", "acme", "--unset", "legacy_cap", "--unset", "test_budget"
    )
    assert status == 0
    assert out.splitlines() == [
        "acme: legacy_cap unset",
        "acme: test_budget unset",
        "running gateways apply it within 5 s",
    ]
    status, out, _ = keys_cli(ini, capsys, "org-set", "acme", "--unset", "test_budget")
    assert status == 0 and out.splitlines() == ["acme: test_budget was not set"]
    status, out, _ = keys_cli(ini, capsys, "org-show", "acme")
    assert out.splitlines()[1].split() == ["regions", "eu-west-1,eu-central-1", "ok"]
    assert out.splitlines()[-2:] == ["declared, not set:", f"  test_budget: {BUDGET_HELP}"]

    status, _, err = keys_cli(ini, capsys, "org-set", "acme", "regions=", "--unset", "regions")
    assert status == 2 and "regions is both set and unset" in err

    create_key(ini, capsys, "beta")
    status, out, _ = keys_cli(ini, capsys, "org-show", "beta")
    assert status == 0 and out.splitlines()[0] == "beta: no settings"


def test_org_regions_is_org_set_for_regions(ini, capsys, declares):
    create_key(ini, capsys, "acme")
    status, out, _ = keys_cli(ini, capsys, "org-regions", "acme")
    assert status == 0 and out.strip() == "acme: regions not set"

    status, out, _ = keys_cli(ini, capsys, "org-regions", "acme", "--set", "eu-west-1,eu-central-1")
    assert status == 0 and out.splitlines()[0] == "acme: regions = eu-west-1,eu-central-1"
    status, out, _ = keys_cli(ini, capsys, "org-regions", "acme")
    assert out.strip() == "acme: regions = eu-west-1,eu-central-1"
    status, _, err = keys_cli(ini, capsys, "org-regions", "acme", "--set", "Mars Base")
    assert status == 2
    assert (
        err
        == "prism keys org-regions: invalid value for regions: 'Mars Base' is not a region name\n"
    )

    # Empty text is a value of its own (for prism-regions: unrestricted), not an unset.
    status, out, _ = keys_cli(ini, capsys, "org-regions", "acme", "--set", "")
    assert status == 0 and out.splitlines()[0] == 'acme: regions = ""'
    status, out, _ = keys_cli(ini, capsys, "org-regions", "acme", "--clear")
    assert status == 0 and out.splitlines()[0] == "acme: regions unset"
    assert KeyStore(ini.parent / "keys.db").org_settings("acme") == {}


def test_org_regions_without_a_plugin_declaring_regions_says_which_plugin_does(
    ini, capsys, monkeypatch
):
    cli_plugins(monkeypatch, DeclaresNothing())
    create_key(ini, capsys, "acme")
    status, _, err = keys_cli(ini, capsys, "org-regions", "acme", "--set", "eu-west-1")
    assert status == 2
    assert "unknown organisation setting 'regions'" in err
    assert "declared by the prism-regions plugin" in err


def test_a_version_1_database_is_migrated_when_opened(ini, capsys, declares):
    key = create_key(ini, capsys, "acme")
    # Made by the prism-keys before organisation settings.
    with contextlib.closing(sqlite3.connect(ini.parent / "keys.db")) as db, db:
        db.execute("DROP TABLE key_settings")
        db.execute("DROP TABLE org_settings")
        db.execute("PRAGMA user_version = 1")

    status, _, _ = keys_cli(ini, capsys, "org-set", "acme", "test_budget=3")
    assert status == 0
    with contextlib.closing(sqlite3.connect(ini.parent / "keys.db")) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    loaded = KeyStore(ini.parent / "keys.db").load_active()
    assert [row.key_id for row in loaded.keys] == [key.split("-")[2]]
    assert loaded.settings == {"acme": {"test_budget": "3"}}


# --- through the real gateway ---


def catalog(fake) -> dict:
    return {
        "providers": {"alpha": {"kind": "openai", "base_url": fake.base_url("ok")}},
        "models": {"chat-a": {"chain": [{"provider": "alpha", "model": "up-a"}]}},
    }


async def start(prism_gateway, prism_fake, tmp_path: Path):
    # Only the plugins named (and the test's own): whatever else is installed
    # cannot declare the same settings.  Polled only when the test says so.
    return await prism_gateway(
        catalog(prism_fake),
        sections={"keys": {"db_path": "keys.db", "refresh_s": 300}},
        base_dir=tmp_path,
        load_plugins=["openai", "keys"],
    )


async def chat(gw, key: str) -> None:
    answer = await gw.openai(api_key=key).chat.completions.create(model="chat-a", messages=MESSAGES)
    assert answer.choices[0].message.content


async def test_a_keys_principal_carries_its_organisations_parsed_settings(
    prism_fake, prism_gateway, prism_plugin, tmp_path, ini, capsys, declares
):
    prism_plugin(declares, PLUGIN_NAME)
    acme = create_key(ini, capsys, "acme")
    acme_too = create_key(ini, capsys, "acme")
    beta = create_key(ini, capsys, "beta")
    status, _, err = keys_cli(
        ini, capsys, "org-set", "acme", "regions=eu-west-1, eu-central-1", "test_budget=12.5"
    )
    assert status == 0, err
    gw = await start(prism_gateway, prism_fake, tmp_path)
    declares.parsed.clear()  # the CLI's checks

    for key in (acme, acme, acme_too, beta):
        await chat(gw, key)
    acme_settings = {"regions": frozenset({"eu-west-1", "eu-central-1"}), "test_budget": 12.5}
    assert [dict(seen) for seen in declares.seen] == [acme_settings] * 3 + [{}]
    with pytest.raises(TypeError):
        declares.seen[0]["test_budget"] = 1e9  # type: ignore[index]  # read-only: shared
    # Parsed once for the snapshot, not per call nor per key.
    assert sorted(declares.parsed) == ["regions", "test_budget"]


async def test_a_change_made_with_the_cli_reaches_the_running_gateway(
    prism_fake, prism_gateway, prism_plugin, tmp_path, ini, capsys, declares
):
    prism_plugin(declares, PLUGIN_NAME)
    key = create_key(ini, capsys, "acme")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    ring = ring_of(gw.gateway.current)
    await chat(gw, key)
    assert declares.seen[-1] == {}

    assert keys_cli(ini, capsys, "org-regions", "acme", "--set", "eu-west-1")[0] == 0
    await chat(gw, key)
    assert declares.seen[-1] == {}  # not re-read yet
    assert await ring.refresh_now()
    await chat(gw, key)
    assert declares.seen[-1] == {"regions": frozenset({"eu-west-1"})}

    assert keys_cli(ini, capsys, "org-set", "acme", "test_budget=3", "--unset", "regions")[0] == 0
    assert await ring.refresh_now()
    await chat(gw, key)
    assert declares.seen[-1] == {"test_budget": 3.0}


async def test_a_value_that_no_longer_parses_is_left_out_and_the_call_goes_on(
    prism_fake, prism_gateway, prism_plugin, tmp_path, ini, capsys, caplog, declares
):
    caplog.set_level(logging.INFO, logger="prism.keys")
    prism_plugin(declares, PLUGIN_NAME)
    key = create_key(ini, capsys, "acme")
    status, _, err = keys_cli(
        ini, capsys, "org-set", "acme", "regions=eu-west-1", "test_budget=42.125"
    )
    assert status == 0, err
    # Declared by a plugin no longer loaded: stored, but nobody reads it.
    KeyStore(ini.parent / "keys.db").update_org_settings("acme", {"legacy_cap": "7"})
    gw = await start(prism_gateway, prism_fake, tmp_path)
    await chat(gw, key)
    assert declares.seen[-1] == {"regions": frozenset({"eu-west-1"}), "test_budget": 42.125}

    # The plugin's declaration changes (a new version, a lower limit) and is reloaded.
    declares.budget_limit = 10
    await gw.gateway.reload(gw.gateway.current.config)
    await chat(gw, key)
    await chat(gw, key)
    assert declares.seen[-2:] == [{"regions": frozenset({"eu-west-1"})}] * 2

    problems = [r for r in caplog.records if "no longer parses" in r.getMessage()]
    assert len(problems) == 1  # once, not per call
    assert problems[0].levelno == logging.WARNING
    assert "'acme'" in problems[0].getMessage() and "'test_budget'" in problems[0].getMessage()
    undeclared = [r for r in caplog.records if "declared by no loaded plugin" in r.getMessage()]
    assert len(undeclared) == 2  # once per generation
    assert all("'legacy_cap'" in r.getMessage() for r in undeclared)
    assert "42.125" not in caplog.text  # names in the log, never values
    status, out, _ = keys_cli(ini, capsys, "org-show", "acme")
    assert "does not parse, left out: must be between 0 and 10" in out
