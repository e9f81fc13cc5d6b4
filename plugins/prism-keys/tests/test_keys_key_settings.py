"""A key's own settings (`prism keys set`) and per-model settings (`NAME@MODEL`).

A test plugin declares `test_rpm` (per key and per model), `test_mode` (per
key only) and `test_budget` (per model, organisation only), and reads
`call.principal.key_settings` and `.settings` in `prism_call_start` into
response headers, so the tests see what reaches a hook through the real
gateway.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import prism_keys.cli_settings
import pytest
from prism_keys import KeyStore, ring_of
from prism_keys.store import SCHEMA_VERSION

from prism_proxy import Call, OrgSetting, hookimpl, per_model_name
from prism_proxy.cli import main
from prism_proxy.plugins import make_plugin_manager, org_settings
from prism_proxy.testing import installed_plugins

PLUGIN_NAME = "test-key-settings"
RPM_HELP = "calls a minute"
MODE_HELP = "hard or soft"
BUDGET_HELP = "a budget"
MESSAGES = [{"role": "user", "content": "hello"}]
#: What `set` lists when a name is unknown: only what may be set on a key.
PER_KEY_LISTING = (
    f"declared per key: test_mode ({MODE_HELP}), "
    f"test_rpm ({RPM_HELP}; also per model as test_rpm@MODEL)"
)


class DeclaresLimits:
    """Declares three settings as a limits plugin would; shows what hooks see in headers."""

    def __init__(self) -> None:
        self.parsed: list[str] = []
        self.seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    @hookimpl
    def prism_org_settings(self) -> list[OrgSetting]:
        def rpm(text: str) -> int:
            self.parsed.append(text)
            value = int(text)
            if value < 1:
                raise ValueError("must be at least 1")
            return value

        def mode(text: str) -> str:
            if text not in ("hard", "soft"):
                raise ValueError("expected hard or soft")
            return text

        return [
            OrgSetting("test_rpm", rpm, RPM_HELP, per_key=True, per_model=True),
            OrgSetting("test_mode", mode, MODE_HELP, per_key=True),
            OrgSetting("test_budget", float, BUDGET_HELP, per_model=True),
        ]

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        key, org = call.principal.key_settings, call.principal.settings
        self.seen.append((dict(key), dict(org)))
        model = per_model_name("test_rpm", call.model.name if call.model else "")
        call.response_headers["x-test-key-rpm"] = f"{key.get('test_rpm')}/{key.get(model)}"
        call.response_headers["x-test-org-rpm"] = f"{org.get('test_rpm')}/{org.get(model)}"


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
def declares(monkeypatch: pytest.MonkeyPatch) -> DeclaresLimits:
    plugin = DeclaresLimits()
    cli_plugins(monkeypatch, plugin)
    return plugin


def write_ini(tmp_path: Path, keys_section: str) -> Path:
    # Only keys, openai and the test's plugin: whatever else is installed
    # (prism-limits, say) declares nothing here.
    others = sorted(set(installed_plugins()) - {"keys", "openai", PLUGIN_NAME})
    disable = f"disable = {', '.join(others)}\n" if others else ""
    path = tmp_path / "prism.ini"
    path.write_text(f"[prism]\ncatalog = catalog.toml\n{disable}\n[prism:keys]\n{keys_section}")
    (tmp_path / "catalog.toml").write_text(
        '[providers.alpha]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n\n'
        '[models.chat-a]\nchain = [{ provider = "alpha", model = "up" }]\n'
    )
    return path


@pytest.fixture
def ini(tmp_path: Path) -> Path:
    return write_ini(tmp_path, "db_path = keys.db\n")


def keys_cli(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["keys", *args, "--config", str(ini)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def create_key(ini: Path, capsys: pytest.CaptureFixture[str], org: str) -> tuple[str, str]:
    """A new key of ``org``: (the key, its key id)."""
    status, out, err = keys_cli(ini, capsys, "create", "--org", org, "--scopes", "chat,model:*")
    assert status == 0, err
    key = out.rstrip("\n").splitlines()[-1]
    return key, key.split("-")[2]


def refused(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one line a refused setting command prints (exit 2, nothing on stdout)."""
    status, out, err = keys_cli(ini, capsys, *args)
    assert (status, out) == (2, ""), (status, out, err)
    assert err.count("\n") == 1
    return err.rstrip("\n")


# --- the command line ---


def test_set_takes_only_what_is_declared_per_key_and_says_why_not(ini, capsys, declares):
    _, key_id = create_key(ini, capsys, "acme")
    store = KeyStore(ini.parent / "keys.db")
    before = store.revision()

    status, out, err = keys_cli(
        ini, capsys, "set", key_id, "test_rpm=60", "test_rpm@chat-a=10", "test_mode=soft"
    )
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"{key_id}: test_rpm = 60",
        f"{key_id}: test_rpm@chat-a = 10",
        f"{key_id}: test_mode = soft",
        "running gateways apply it within 5 s",
    ]
    assert store.key_settings(key_id=key_id) == {
        key_id: {"test_mode": "soft", "test_rpm": "60", "test_rpm@chat-a": "10"}
    }
    assert store.revision() == before + 1  # one transaction

    prefix = "prism keys set: "
    assert refused(ini, capsys, "set", key_id, "test_budget=5") == (
        f"{prefix}test_budget is organisation-only: its declaration does not allow it on one "
        "key (set it for the organisation: prism keys org-set ORG test_budget=VALUE)"
    )
    assert "test_budget is organisation-only" in refused(
        ini, capsys, "set", key_id, "test_budget@chat-a=5"
    )
    assert refused(ini, capsys, "set", key_id, "test_mode@chat-a=soft") == (
        f"{prefix}test_mode cannot be set per model (test_mode@chat-a): its declaration does "
        "not allow NAME@MODEL (set test_mode=VALUE for every model)"
    )
    assert refused(ini, capsys, "set", key_id, "tset_rpm=5") == (
        f"{prefix}unknown setting 'tset_rpm'; {PER_KEY_LISTING}"
    )
    assert refused(ini, capsys, "set", key_id, "test_rpm=lots") == (
        f"{prefix}invalid value for test_rpm: invalid literal for int() with base 10: 'lots'"
    )
    assert refused(ini, capsys, "set", key_id, "test_rpm@chat-a=0") == (
        f"{prefix}invalid value for test_rpm@chat-a: must be at least 1"
    )
    assert refused(ini, capsys, "set", key_id, "test_rpm@=5") == (
        f"{prefix}expected NAME@MODEL=VALUE, got a setting named 'test_rpm@'"
    )
    assert refused(ini, capsys, "set", key_id, "test_rpm") == (
        f"{prefix}expected NAME=VALUE, got 'test_rpm'"
    )
    assert "test_rpm@chat-a is given twice" in refused(
        ini, capsys, "set", key_id, "test_rpm@chat-a=1", "test_rpm@chat-a=2"
    )
    assert "nothing to do" in refused(ini, capsys, "set", key_id)
    # All or nothing: a good setting beside a bad one is not written either.
    assert "invalid value for test_mode" in refused(
        ini, capsys, "set", key_id, "test_rpm=1", "test_mode=medium"
    )
    assert store.revision() == before + 1
    assert store.key_settings(key_id=key_id)[key_id]["test_rpm"] == "60"

    # A model the catalog does not have: said, not refused (the catalog may be about to change).
    status, out, err = keys_cli(ini, capsys, "set", key_id, "test_rpm@gpt-9=3")
    assert status == 0
    assert out.splitlines()[0] == f"{key_id}: test_rpm@gpt-9 = 3"
    assert err == (
        "prism keys: warning: test_rpm@gpt-9: model 'gpt-9' is not in the catalog: the "
        "setting applies to no call until it is\n"
    )

    status, out, _ = keys_cli(
        ini, capsys, "set", key_id, "test_rpm=30", "--unset", "test_rpm@gpt-9", "--unset", "gone"
    )
    assert status == 0
    assert out.splitlines() == [
        f"{key_id}: test_rpm = 30",
        f"{key_id}: test_rpm@gpt-9 unset",
        f"{key_id}: gone was not set",
        "running gateways apply it within 5 s",
    ]


def test_set_refuses_unknown_and_revoked_keys_and_never_echoes_a_key(ini, capsys, declares):
    key, key_id = create_key(ini, capsys, "acme")
    status, out, err = keys_cli(ini, capsys, "set", "0123456789ab", "test_rpm=5")
    assert (status, out) == (1, "")
    assert err == "prism keys set: unknown key id '0123456789ab' (see prism keys list)\n"
    status, _, err = keys_cli(ini, capsys, "show", "0123456789ab")
    assert status == 1 and "unknown key id '0123456789ab'" in err
    for action in ("set", "show", "revoke"):
        status, out, err = keys_cli(ini, capsys, action, key, *(["test_rpm=5"] * (action == "set")))
        assert status == 1 and "give the key id" in err
        assert key not in out + err and key[len("sk-prism-") + 13 :] not in out + err

    assert keys_cli(ini, capsys, "set", key_id, "test_mode=hard")[0] == 0
    assert keys_cli(ini, capsys, "revoke", key_id)[0] == 0
    status, _, err = keys_cli(ini, capsys, "set", key_id, "test_rpm=5")
    assert status == 1
    assert err == (
        f"prism keys set: key id '{key_id}' is revoked: a setting on it would apply to nothing\n"
    )
    status, out, _ = keys_cli(ini, capsys, "set", key_id, "--unset", "test_mode")
    assert status == 0 and out.splitlines()[0] == f"{key_id}: test_mode unset"


def test_org_set_takes_per_model_names_where_declared(ini, capsys, declares):
    create_key(ini, capsys, "acme")
    status, out, err = keys_cli(
        ini,
        capsys,
        "org-set",
        "acme",
        "test_budget=50",
        "test_budget@chat-a=5",
        "test_rpm@chat-a=9",
    )
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        "acme: test_budget = 50",
        "acme: test_budget@chat-a = 5",
        "acme: test_rpm@chat-a = 9",
        "running gateways apply it within 5 s",
    ]
    prefix = "prism keys org-set: "
    assert refused(ini, capsys, "org-set", "acme", "test_mode@chat-a=soft") == (
        f"{prefix}test_mode cannot be set per model (test_mode@chat-a): its declaration does "
        "not allow NAME@MODEL (set test_mode=VALUE for every model)"
    )
    assert refused(ini, capsys, "org-set", "acme", "test_budget@chat-a=much") == (
        f"{prefix}invalid value for test_budget@chat-a: could not convert string to float: 'much'"
    )
    assert refused(ini, capsys, "org-set", "acme", "nosuch@chat-a=1") == (
        f"{prefix}unknown organisation setting 'nosuch'; declared: test_budget ({BUDGET_HELP}; "
        f"also per model as test_budget@MODEL), test_mode ({MODE_HELP}; also per key), "
        f"test_rpm ({RPM_HELP}; also per key and per model as test_rpm@MODEL)"
    )
    status, out, err = keys_cli(ini, capsys, "org-set", "acme", "test_budget@gpt-9=1")
    assert status == 0 and out.splitlines()[0] == "acme: test_budget@gpt-9 = 1"
    assert "warning: test_budget@gpt-9: model 'gpt-9' is not in the catalog" in err

    status, out, _ = keys_cli(ini, capsys, "org-set", "acme", "--unset", "test_budget@gpt-9")
    assert status == 0
    assert out.splitlines() == [
        "acme: test_budget@gpt-9 unset",
        "running gateways apply it within 5 s",
    ]
    assert KeyStore(ini.parent / "keys.db").org_settings("acme") == {
        "test_budget": "50",
        "test_budget@chat-a": "5",
        "test_rpm@chat-a": "9",
    }


def test_show_list_and_org_show_show_a_keys_settings(ini, capsys, declares):
    _, key_id = create_key(ini, capsys, "acme")
    _, plain = create_key(ini, capsys, "acme")
    _, gone = create_key(ini, capsys, "acme")
    assert keys_cli(ini, capsys, "set", key_id, "test_rpm=60", "test_rpm@chat-a=10")[0] == 0
    assert keys_cli(ini, capsys, "set", gone, "test_mode=hard")[0] == 0
    assert keys_cli(ini, capsys, "revoke", gone)[0] == 0
    assert keys_cli(ini, capsys, "org-set", "acme", "test_budget@chat-a=5")[0] == 0
    # Stored earlier, under declarations that have changed since.
    KeyStore(ini.parent / "keys.db").update_key_settings(
        key_id, {"test_mode": "medium", "test_budget": "3", "legacy": "1"}
    )

    status, out, _ = keys_cli(ini, capsys, "show", key_id)
    assert status == 0
    lines = out.splitlines()
    assert lines[:3] == [f"key id:  {key_id}", "org:     acme", "scopes:  chat,model:*"]
    assert lines[4] == "status:  active"
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines[5:]}
    assert rows == {
        "setting": "value status",
        "legacy": "1 declared by no loaded plugin: ignored",
        "test_budget": "3 organisation-only (its declaration does not allow it per key): ignored",
        "test_mode": "medium does not parse, left out: expected hard or soft",
        "test_rpm": "60 ok",
        "test_rpm@chat-a": "10 ok",
    }
    status, out, _ = keys_cli(ini, capsys, "show", plain)
    assert out.splitlines()[5:] == [
        f"{plain}: no settings of its own",
        "declared per key, not set:",
        f"  test_mode: {MODE_HELP}",
        f"  test_rpm: {RPM_HELP}",
    ]
    status, out, _ = keys_cli(ini, capsys, "show", gone)
    assert "status:  revoked " in out and "its settings apply to nothing" in out

    status, out, _ = keys_cli(ini, capsys, "list")
    listed = {line.split()[0]: line for line in out.splitlines()}
    assert listed["key"].split()[-1] == "settings"
    # key id, org, scopes, created, status, then the settings (last: a value may hold spaces).
    assert listed[key_id].split(None, 5)[4:] == [
        "active",
        "legacy=1; test_budget=3; test_mode=medium; test_rpm=60; test_rpm@chat-a=10",
    ]
    assert listed[plain].split(None, 5)[4:] == ["active", "-"]
    assert listed[gone].endswith("test_mode=hard")

    status, out, _ = keys_cli(ini, capsys, "org-show", "acme")
    lines = out.splitlines()
    assert lines[1].split() == ["test_budget@chat-a", "5", "ok"]
    assert lines[2] == "key settings (prism keys show KEY_ID):"
    assert lines[3].split() == ["key", "id", "setting", "value", "status"]
    # By key (in the order they were made: within a second, any), then by name.
    key_rows = [line.split() for line in lines[4:10]]
    assert sorted(row[:3] for row in key_rows) == sorted(
        [
            [key_id, "legacy", "1"],
            [key_id, "test_budget", "3"],
            [key_id, "test_mode", "medium"],
            [key_id, "test_rpm", "60"],
            [key_id, "test_rpm@chat-a", "10"],
            [gone, "test_mode", "hard"],
        ]
    )
    assert [row[1] for row in key_rows if row[0] == key_id] == [
        "legacy",
        "test_budget",
        "test_mode",
        "test_rpm",
        "test_rpm@chat-a",
    ]
    assert [" ".join(row[3:]) for row in key_rows if row[0] == gone] == [
        "key revoked: applies to nothing"
    ]
    assert lines[10:] == [
        "declared, not set:",
        f"  test_budget: {BUDGET_HELP}",
        f"  test_mode: {MODE_HELP}",
        f"  test_rpm: {RPM_HELP}",
    ]


# --- the SQLite store ---


def test_sqlite_store_keeps_key_settings_and_loads_only_the_active_keys(tmp_path):
    store = KeyStore(tmp_path / "keys.db")
    store.ensure_schema()
    a, b, c = (store.create_key(org, ["chat"]).key_id for org in ("acme", "acme", "beta"))
    before = store.revision()
    assert store.update_key_settings(a, {"test_rpm": "10", "test_rpm@chat-a": "5"}) == set()
    assert store.update_key_settings(b, {"test_mode": "soft"}) == set()
    assert store.update_key_settings(c, {"test_rpm": "1"}) == set()
    assert store.revision() == before + 3
    assert store.update_key_settings("0123456789ab", {"test_rpm": "1"}) is None
    assert store.update_key_settings(a, {}, ["never-set"]) == set()
    assert store.revision() == before + 3  # nothing written, nothing bumped

    assert store.key_settings(org="acme") == {
        a: {"test_rpm": "10", "test_rpm@chat-a": "5"},
        b: {"test_mode": "soft"},
    }
    assert store.key_settings(key_id=c) == {c: {"test_rpm": "1"}}
    assert store.update_key_settings(a, {"test_rpm": "20"}, ["test_rpm@chat-a"]) == {
        "test_rpm@chat-a"
    }
    assert store.key(a) is not None and store.key(a).org == "acme"
    assert store.key("0123456789ab") is None

    # A revoked key's settings stay (show says so) but no gateway loads them.
    store.revoke(b)
    loaded = store.load_active()
    assert loaded.key_settings == {a: {"test_rpm": "20"}, c: {"test_rpm": "1"}}
    assert store.key_settings(key_id=b) == {b: {"test_mode": "soft"}}

    # A key row deleted (by hand: prism keys revokes, it never deletes) takes its settings.
    with contextlib.closing(sqlite3.connect(tmp_path / "keys.db")) as db, db:
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("DELETE FROM keys WHERE id = ?", (b,))
        left = db.execute("SELECT key_id FROM key_settings ORDER BY key_id").fetchall()
    assert sorted(row[0] for row in left) == sorted([a, c])


def test_a_version_2_database_is_migrated_and_keeps_its_settings(tmp_path):
    path = tmp_path / "keys.db"
    store = KeyStore(path)
    store.ensure_schema()
    key_id = store.create_key("acme", ["chat"]).key_id
    store.update_org_settings("acme", {"test_budget": "5"})
    # Made by the prism-keys before key settings.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE key_settings")
        db.execute("PRAGMA user_version = 2")

    store = KeyStore(path)
    store.ensure_schema()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert store.update_key_settings(key_id, {"test_rpm": "7"}) == set()
    loaded = store.load_active()
    assert loaded.settings == {"acme": {"test_budget": "5"}}
    assert loaded.key_settings == {key_id: {"test_rpm": "7"}}

    # A prism-keys that knows only version 2 would refuse the file; this one refuses a newer.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(sqlite3.DatabaseError, match="upgrade prism-keys"):
        KeyStore(path).ensure_schema()


# --- through the real gateway ---


def catalog(fake) -> dict:
    return {
        "providers": {"alpha": {"kind": "openai", "base_url": fake.base_url("ok")}},
        "models": {
            "chat-a": {"chain": [{"provider": "alpha", "model": "up-a"}]},
            "chat-b": {"chain": [{"provider": "alpha", "model": "up-b"}]},
        },
    }


async def start(prism_gateway, prism_fake, tmp_path: Path, section: Mapping[str, Any]):
    # Only the plugins named (and the test's own): whatever else is installed
    # cannot declare the same settings.
    return await prism_gateway(
        catalog(prism_fake),
        sections={"keys": dict(section)},
        base_dir=tmp_path,
        load_plugins=["openai", "keys"],
    )


async def seen_rpm(gw, key: str, model: str) -> tuple[str, str]:
    """(key's test_rpm/test_rpm@model, org's test_rpm/test_rpm@model) as the hook saw them."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": model, "messages": MESSAGES},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            assert response.status == 200, await response.text()
            return response.headers["x-test-key-rpm"], response.headers["x-test-org-rpm"]


async def test_a_keys_own_and_per_model_settings_reach_the_hook_and_cli_changes_follow(
    prism_fake, prism_gateway, prism_plugin, tmp_path, ini, capsys, declares
):
    prism_plugin(declares, PLUGIN_NAME)
    own, own_id = create_key(ini, capsys, "acme")
    plain, _ = create_key(ini, capsys, "acme")
    for args in (
        ("org-set", "acme", "test_rpm=100", "test_rpm@chat-a=50"),
        ("set", own_id, "test_rpm=10", "test_rpm@chat-a=5"),
    ):
        status, _, err = keys_cli(ini, capsys, *args)
        assert status == 0, err
    # Polled only when the test says so (refresh_now).
    gw = await start(prism_gateway, prism_fake, tmp_path, {"db_path": "keys.db", "refresh_s": 300})
    ring = ring_of(gw.gateway.current)
    declares.parsed.clear()  # the CLI's checks

    assert await seen_rpm(gw, own, "chat-a") == ("10/5", "100/50")
    assert await seen_rpm(gw, own, "chat-b") == ("10/None", "100/None")
    assert await seen_rpm(gw, plain, "chat-a") == ("None/None", "100/50")
    assert await seen_rpm(gw, own, "chat-a") == ("10/5", "100/50")
    assert declares.seen[0] == (
        {"test_rpm": 10, "test_rpm@chat-a": 5},
        {"test_rpm": 100, "test_rpm@chat-a": 50},
    )
    # Parsed once for the snapshot (the org's two, the key's two), not per call.
    assert sorted(declares.parsed) == sorted(["100", "50", "10", "5"])

    status, _, err = keys_cli(
        ini, capsys, "set", own_id, "test_rpm@chat-b=2", "--unset", "test_rpm"
    )
    assert status == 0, err
    assert await seen_rpm(gw, own, "chat-b") == ("10/None", "100/None")  # not re-read yet
    assert await ring.refresh_now()
    assert await seen_rpm(gw, own, "chat-b") == ("None/2", "100/None")
    assert await seen_rpm(gw, own, "chat-a") == ("None/5", "100/50")

    # Revoked: its settings go with it (and the key is refused).
    assert keys_cli(ini, capsys, "revoke", own_id)[0] == 0
    assert await ring.refresh_now()
    assert own_id not in ring.snapshot.key_settings
    assert await seen_rpm(gw, plain, "chat-b") == ("None/None", "100/None")


async def test_a_key_setting_that_no_longer_parses_is_left_out_and_the_call_goes_on(
    prism_fake, prism_gateway, prism_plugin, tmp_path, ini, capsys, caplog, declares
):
    caplog.set_level(logging.INFO, logger="prism.keys")
    prism_plugin(declares, PLUGIN_NAME)
    key, key_id = create_key(ini, capsys, "acme")
    # Stored under earlier declarations: a value, a name and a NAME@MODEL they no longer take.
    store = KeyStore(ini.parent / "keys.db")
    store.update_key_settings(
        key_id, {"test_rpm": "lots-9137", "test_rpm@chat-a": "4", "test_budget": "3"}
    )
    store.update_org_settings("acme", {"test_mode@chat-a": "soft", "test_rpm": "100"})
    gw = await start(prism_gateway, prism_fake, tmp_path, {"db_path": "keys.db", "refresh_s": 300})

    assert await seen_rpm(gw, key, "chat-a") == ("None/4", "100/None")
    assert await seen_rpm(gw, key, "chat-a") == ("None/4", "100/None")
    assert declares.seen[-1] == ({"test_rpm@chat-a": 4}, {"test_rpm": 100})

    messages = [r.getMessage() for r in caplog.records]
    invalid = [m for m in messages if "no longer parses" in m]
    assert invalid == [
        f"keys: key '{key_id}': setting 'test_rpm' no longer parses (ValueError); left out "
        f"(see `prism keys show {key_id}`)"
    ]
    assert [m for m in messages if "; ignored" in m] == [
        "keys: organisation setting 'test_mode@chat-a' (set for 'acme') is not settable per "
        "model (its declaration does not allow NAME@MODEL); ignored",
        f"keys: key setting 'test_budget' (set on key '{key_id}') is organisation-only (its "
        "declaration does not allow it per key); ignored",
    ]
    assert "lots-9137" not in caplog.text  # names in the log, never values
