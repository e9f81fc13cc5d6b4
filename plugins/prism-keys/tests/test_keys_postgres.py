"""``[prism:keys] db_url``: keys in PostgreSQL, shared by every replica.

Each test gets a database of its own (random name) on the server at
127.0.0.1:5432 and drops it at the end, whatever happened.  Two gateways
stand for two replicas; keys are made and revoked with the real CLI.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prism_keys import ring_of

from prism_proxy import ConfigError, create_app, redact_url

from .test_keys_gateway import create_key, keys_cli

SERVER = "127.0.0.1:5432"
#: Trust authentication accepts any password: it is there to be kept out of every message.
PASSWORD = "s3cret-Pw-" + secrets.token_hex(4)
MESSAGES = [{"role": "user", "content": "hello"}]


async def _admin() -> asyncpg.Connection:
    return await asyncpg.connect(f"postgresql://postgres@{SERVER}/postgres", timeout=5)


@pytest.fixture
def pg_url(prism_postgres: str) -> str:
    """The test's database, its URL with a password that must never be shown."""
    return prism_postgres.replace("postgres@", f"postgres:{PASSWORD}@", 1)


def write_ini(tmp_path: Path, keys_section: str) -> Path:
    path = tmp_path / "prism.ini"
    path.write_text(f"[prism]\ncatalog = catalog.toml\n\n[prism:keys]\n{keys_section}")
    (tmp_path / "catalog.toml").write_text(
        '[providers.alpha]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n\n'
        '[models.chat-a]\nchain = [{ provider = "alpha", model = "up" }]\n'
    )
    return path


async def replicas(prism_gateway: Any, prism_fake: Any, url: str, refresh_s: float) -> list[Any]:
    catalog = {
        "providers": {"alpha": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"chat-a": {"chain": [{"provider": "alpha", "model": "up-a"}]}},
    }
    section = {"db_url": url, "refresh_s": refresh_s}
    return [await prism_gateway(catalog, sections={"keys": section}) for _ in range(2)]


async def chat_status(gw: Any, key: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "chat-a", "messages": MESSAGES},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            return response.status


async def statuses(gateways: list[Any], key: str) -> list[int]:
    return [await chat_status(gw, key) for gw in gateways]


async def wait_for_statuses(
    gateways: list[Any], key: str, wanted: list[int], within_s: float
) -> float:
    """Seconds until every gateway answers ``wanted`` for ``key``; fails after ``within_s``."""
    started = time.monotonic()
    while True:
        got = await statuses(gateways, key)
        elapsed = time.monotonic() - started
        if got == wanted:
            return elapsed
        assert elapsed < within_s, f"still {got} after {elapsed:.2f} s"
        await asyncio.sleep(0.02)


async def test_replicas_share_keys_and_a_revocation_reaches_both_by_polling(
    prism_gateway, prism_fake, pg_url, tmp_path, capsys, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG)
    ini = write_ini(tmp_path, f"db_url = {pg_url}\nrefresh_s = 0.2\n")
    early = create_key(ini, capsys, "acme", "chat,model:*")
    gateways = await replicas(prism_gateway, prism_fake, pg_url, 0.2)
    rings = [ring_of(gw.gateway.current) for gw in gateways]
    assert rings[0] is not rings[1]  # two replicas, two rings, one database
    assert await statuses(gateways, early) == [200, 200]

    # No NOTIFY from here on: only the poll can tell the replicas.
    for ring in rings:
        await ring.store.stop_listening()
    monkeypatch.setattr("prism_keys.pg_store.PgKeyStore.listen", _cannot_listen)

    late = create_key(ini, capsys, "acme", "chat,model:chat-a")
    await wait_for_statuses(gateways, late, [200, 200], within_s=3)

    status, out = keys_cli(ini, capsys, "revoke", late.split("-")[2])
    assert status == 0 and "revoked" in out
    elapsed = await wait_for_statuses(gateways, late, [401, 401], within_s=3)
    assert elapsed < 1.0  # within a few refresh_s, not at once by chance of a NOTIFY
    assert await statuses(gateways, early) == [200, 200]

    status, out = keys_cli(ini, capsys, "list")
    assert status == 0 and late.split("-")[2] in out and "revoked" in out
    assert late not in out
    # The key text is not in the database, the password in no log line.
    conn = await asyncpg.connect(pg_url)
    try:
        stored = [tuple(r) for r in await conn.fetch("SELECT * FROM prism_keys_keys")]
    finally:
        await conn.close()
    assert len(stored) == 2 and late not in repr(stored) and early not in repr(stored)
    assert PASSWORD not in caplog.text and late not in caplog.text
    assert redact_url(pg_url) in caplog.text


async def _cannot_listen(self: Any, on_change: Any) -> None:
    raise OSError("listening is switched off for this test")


async def test_a_revocation_reaches_both_replicas_at_once_through_notify(
    prism_gateway, prism_fake, pg_url, tmp_path, capsys, caplog
):
    ini = write_ini(tmp_path, f"db_url = {pg_url}\nrefresh_s = 60\n")
    key = create_key(ini, capsys, "acme", "chat,model:*")
    gateways = await replicas(prism_gateway, prism_fake, pg_url, 60)
    assert await statuses(gateways, key) == [200, 200]

    # A key created after start-up works on both at once, too.
    other = create_key(ini, capsys, "globex", "chat,model:*")
    await wait_for_statuses(gateways, other, [200, 200], within_s=0.5)

    status, _ = keys_cli(ini, capsys, "revoke", key.split("-")[2])
    assert status == 0
    await wait_for_statuses(gateways, key, [401, 401], within_s=0.5)
    assert await statuses(gateways, other) == [200, 200]

    # Tags and settings changes are announced as well.
    status, _ = keys_cli(ini, capsys, "org-tags", "globex", "--set", "eu")
    assert status == 0
    for gw in gateways:
        ring = ring_of(gw.gateway.current)
        deadline = time.monotonic() + 0.5
        while ring.snapshot.keys[other.split("-")[2]].principal.org_tags != {"eu"}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    assert PASSWORD not in caplog.text


async def test_a_lost_listener_is_replaced_and_polling_covers_the_gap(
    prism_gateway, prism_fake, pg_url, tmp_path, capsys
):
    ini = write_ini(tmp_path, f"db_url = {pg_url}\nrefresh_s = 0.2\n")
    key = create_key(ini, capsys, "acme", "chat,model:*")
    [gw, _] = await replicas(prism_gateway, prism_fake, pg_url, 0.2)
    ring = ring_of(gw.gateway.current)
    # Every listener connection is killed by the server, as a failover would.
    admin = await _admin()
    try:
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = $1 AND query ILIKE 'LISTEN%'",
            pg_url.rsplit("/", 1)[1],
        )
    finally:
        await admin.close()
    assert killed == 2  # one listener per replica
    deadline = time.monotonic() + 3
    while ring.store.listening:  # the ring notices at its next poll
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    status, _ = keys_cli(ini, capsys, "revoke", key.split("-")[2])
    assert status == 0
    await wait_for_statuses([gw], key, [401], within_s=3)
    deadline = time.monotonic() + 3
    while not ring.store.listening:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


def test_cli_org_commands_on_postgres(pg_url, tmp_path, capsys):
    ini = write_ini(tmp_path, f"db_url = {pg_url}\n")
    status, out = keys_cli(ini, capsys, "org-tags", "acme", "--set", "eu,enterprise")
    assert status == 0 and "acme: enterprise,eu" in out
    key = create_key(ini, capsys, "acme", "chat")
    status, out = keys_cli(ini, capsys, "orgs")
    assert status == 0 and "acme" in out and "enterprise,eu" in out
    status, out = keys_cli(ini, capsys, "org-show", "acme")
    assert status == 0 and "no settings" in out
    status, out = keys_cli(ini, capsys, "org-set", "acme", "--unset", "legacy_cap")
    assert status == 0 and "acme: legacy_cap was not set" in out
    status, out = keys_cli(ini, capsys, "org-set", "nobody", "--unset", "legacy_cap")
    assert status == 1 and "unknown organisation" in out
    status, out = keys_cli(ini, capsys, "org-tags", "nobody")
    assert status == 1 and "unknown organisation" in out
    status, out = keys_cli(ini, capsys, "revoke", "0123456789ab")
    assert status == 1 and "unknown key id" in out
    key_id = key.split("-")[2]
    assert keys_cli(ini, capsys, "revoke", key_id)[0] == 0
    status, out = keys_cli(ini, capsys, "revoke", key_id)
    assert status == 0 and "already revoked" in out


def test_unreachable_database_is_reported_without_the_password(tmp_path, capsys):
    ini = write_ini(tmp_path, f"db_url = postgresql://postgres:{PASSWORD}@127.0.0.1:1/keys\n")
    status, out = keys_cli(ini, capsys, "list")
    assert status == 1
    assert "postgresql://postgres:***@127.0.0.1:1/keys" in out
    assert PASSWORD not in out


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            "db_path = keys.db\ndb_url = postgresql://h/db\n",
            r"\[prism:keys\] db_url: db_path is set too",
        ),
        (
            f"db_url = mysql://root:{PASSWORD}@h/db\n",
            r"\[prism:keys\] db_url: expected a postgresql:// or postgres:// URL, "
            r"got 'mysql://root:\*\*\*@h/db'",
        ),
        (f"db_url = postgresql://u:{PASSWORD}@h:notaport/db\n", r"\[prism:keys\] db_url: "),
        ("db_url = \nrefresh_s = 1\n", r"\[prism:keys\] db_path: missing"),
    ],
    # Ids without the random password: every xdist worker must collect the same names.
    ids=["db-path-and-url", "not-postgresql", "bad-port", "no-db-path"],
)
def test_configuration_mistakes_stop_start_up(tmp_path, capsys, section, message):
    ini = write_ini(tmp_path, section)
    with pytest.raises(ConfigError, match=message) as raised:
        create_app(ini)
    assert PASSWORD not in str(raised.value)
    status, out = keys_cli(ini, capsys, "list")
    assert status == 2 and PASSWORD not in out


async def test_unreachable_database_stops_start_up_without_the_password(
    prism_gateway, prism_fake, caplog
):
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/keys"
    with pytest.raises(Exception) as raised:
        await replicas(prism_gateway, prism_fake, url, 1)
    assert PASSWORD not in str(raised.value) and PASSWORD not in caplog.text
