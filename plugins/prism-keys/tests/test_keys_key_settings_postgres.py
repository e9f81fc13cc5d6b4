"""Key settings in PostgreSQL (``db_url``): the store, its migration, the CLI, a gateway.

Each test gets a database of its own (``prism_postgres``: random name,
dropped at the end) on the server at 127.0.0.1:5432.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from prism_keys.pg_store import PG_SCHEMA_VERSION, SyncPgKeyStore

from .test_keys_key_settings import (
    PLUGIN_NAME,
    DeclaresLimits,
    cli_plugins,
    create_key,
    keys_cli,
    seen_rpm,
    start,
    write_ini,
)


@pytest.fixture
def declares(monkeypatch: pytest.MonkeyPatch) -> DeclaresLimits:
    plugin = DeclaresLimits()
    cli_plugins(monkeypatch, plugin)
    return plugin


def test_postgres_store_keeps_key_settings_and_loads_only_the_active_keys(prism_postgres):
    store = SyncPgKeyStore(prism_postgres)
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
    assert set(store.key_settings()) == {a, b, c}
    assert store.update_key_settings(a, {"test_rpm": "20"}, ["test_rpm@chat-a"]) == {
        "test_rpm@chat-a"
    }
    row = store.key(a)
    assert row is not None and (row.org, row.revoked) == ("acme", None)
    assert store.key("0123456789ab") is None

    store.revoke(b)
    loaded = store.load_active()
    assert loaded.key_settings == {a: {"test_rpm": "20"}, c: {"test_rpm": "1"}}
    assert store.key_settings(key_id=b) == {b: {"test_mode": "soft"}}

    # A key row deleted (by hand: prism keys revokes, it never deletes) takes its settings.
    async def delete_b() -> list[str]:
        conn = await asyncpg.connect(prism_postgres)
        try:
            await conn.execute("DELETE FROM prism_keys_keys WHERE id = $1", b)
            return [r[0] for r in await conn.fetch("SELECT key_id FROM prism_keys_key_settings")]
        finally:
            await conn.close()

    assert sorted(asyncio.run(delete_b())) == sorted([a, c])


def test_a_version_1_postgres_schema_is_migrated_and_keeps_its_data(prism_postgres):
    store = SyncPgKeyStore(prism_postgres)
    store.ensure_schema()
    key_id = store.create_key("acme", ["chat"]).key_id
    store.update_org_settings("acme", {"test_budget": "5"})

    async def sql(*statements: str) -> int:
        conn = await asyncpg.connect(prism_postgres)
        try:
            for statement in statements:
                await conn.execute(statement)
            return int(await conn.fetchval("SELECT version FROM prism_keys_schema"))
        finally:
            await conn.close()

    # As the prism-keys before key settings left it.
    asyncio.run(
        sql("DROP TABLE prism_keys_key_settings", "UPDATE prism_keys_schema SET version = 1")
    )
    store.ensure_schema()
    assert asyncio.run(sql()) == PG_SCHEMA_VERSION == 3
    assert store.update_key_settings(key_id, {"test_rpm": "7"}) == set()
    loaded = store.load_active()
    assert loaded.settings == {"acme": {"test_budget": "5"}}
    assert loaded.key_settings == {key_id: {"test_rpm": "7"}}


def test_cli_key_and_per_model_settings_on_postgres(prism_postgres, tmp_path, capsys, declares):
    ini = write_ini(tmp_path, f"db_url = {prism_postgres}\n")
    _, key_id = create_key(ini, capsys, "acme")
    status, out, err = keys_cli(ini, capsys, "set", key_id, "test_rpm=60", "test_rpm@gpt-9=1")
    assert status == 0
    assert out.splitlines() == [
        f"{key_id}: test_rpm = 60",
        f"{key_id}: test_rpm@gpt-9 = 1",
        "running gateways apply it within 5 s",
    ]
    assert "warning: test_rpm@gpt-9: model 'gpt-9' is not in the catalog" in err
    status, _, err = keys_cli(ini, capsys, "set", key_id, "test_budget=1")
    assert status == 2 and "test_budget is organisation-only" in err
    status, _, err = keys_cli(ini, capsys, "set", "0123456789ab", "test_rpm=1")
    assert status == 1 and "unknown key id '0123456789ab'" in err
    status, out, _ = keys_cli(ini, capsys, "org-set", "acme", "test_budget@chat-a=5")
    assert status == 0 and out.splitlines()[0] == "acme: test_budget@chat-a = 5"

    status, out, _ = keys_cli(ini, capsys, "show", key_id)
    assert status == 0
    assert [line.split() for line in out.splitlines()[6:]] == [
        ["test_rpm", "60", "ok"],
        ["test_rpm@gpt-9", "1", "ok"],
        ["declared", "per", "key,", "not", "set:"],
        ["test_mode:", "hard", "or", "soft"],
    ]
    status, out, _ = keys_cli(ini, capsys, "list")
    assert out.splitlines()[1].endswith("test_rpm=60; test_rpm@gpt-9=1")
    status, out, _ = keys_cli(ini, capsys, "org-show", "acme")
    assert out.splitlines()[1].split() == ["test_budget@chat-a", "5", "ok"]
    assert [key_id, "test_rpm", "60", "ok"] in [line.split() for line in out.splitlines()]
    status, out, _ = keys_cli(ini, capsys, "set", key_id, "--unset", "test_rpm@gpt-9")
    assert status == 0 and out.splitlines()[0] == f"{key_id}: test_rpm@gpt-9 unset"


async def test_a_key_setting_reaches_a_gateway_at_once_through_notify(
    prism_fake, prism_gateway, prism_plugin, prism_postgres, tmp_path, capsys, declares
):
    prism_plugin(declares, PLUGIN_NAME)
    ini = write_ini(tmp_path, f"db_url = {prism_postgres}\n")
    key, key_id = create_key(ini, capsys, "acme")
    assert keys_cli(ini, capsys, "org-set", "acme", "test_rpm@chat-a=50")[0] == 0
    # A poll only every 60 s: what arrives sooner came by NOTIFY.
    gw = await start(
        prism_gateway, prism_fake, tmp_path, {"db_url": prism_postgres, "refresh_s": 60}
    )
    assert await seen_rpm(gw, key, "chat-a") == ("None/None", "None/50")

    status, _, err = keys_cli(ini, capsys, "set", key_id, "test_rpm=10", "test_rpm@chat-a=5")
    assert status == 0, err
    deadline = time.monotonic() + 5
    while (seen := await seen_rpm(gw, key, "chat-a")) != ("10/5", "None/50"):
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.02)
