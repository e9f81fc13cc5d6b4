"""The ``principals`` service prism-keys provides: who an organisation or a key id is.

Asked of a generation built from the configuration and never started (what
``prism limits show`` does: the service reads the store itself and releases
what it opened) and of a serving gateway (answers from the key ring the
calls are authenticated with), for SQLite and for PostgreSQL (a database of
its own per test, ``prism_postgres``).  The test plugin of
:mod:`.test_keys_key_settings` declares ``test_rpm`` (per key, per model),
``test_mode`` (per key) and ``test_budget`` (per model, organisation only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import asyncpg
import attrs
import pytest
from prism_keys import KeyStore, hash_key, ring_of
from prism_keys.pg_store import SyncPgKeyStore

from prism_proxy import GATEWAY, PRINCIPALS, Generation, Principal, Principals, create_app

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

UNKNOWN_ID = "0123456789ab"
ACME_TAGS = frozenset({"eu", "gold"})
ACME_SETTINGS = {"test_rpm": 100, "test_rpm@chat-a": 50, "test_budget@chat-a": 5.0}
OWN_SETTINGS = {"test_rpm": 10, "test_rpm@chat-a": 5, "test_mode": "soft"}
SCOPES = frozenset({"chat", "model:*"})


@pytest.fixture
def declares(monkeypatch: pytest.MonkeyPatch) -> DeclaresLimits:
    plugin = DeclaresLimits()
    cli_plugins(monkeypatch, plugin)
    return plugin


@attrs.frozen
class Made:
    """What :func:`populate` made with the real CLI: keys (text) and their ids."""

    own: str
    own_id: str
    plain: str
    plain_id: str
    gone: str
    gone_id: str
    lapsed_id: str

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.own, self.plain, self.gone)


def ok(result: tuple[int, str, str]) -> None:
    assert result[0] == 0, result


def populate(ini: Path, capsys: pytest.CaptureFixture[str], raw: Any) -> Made:
    """acme: two active keys (one with settings of its own) and a revoked one, tags and
    settings (one stored under older declarations); beta: tags only, no key; gamma: a
    revoked key only."""
    own, own_id = create_key(ini, capsys, "acme")
    plain, plain_id = create_key(ini, capsys, "acme")
    gone, gone_id = create_key(ini, capsys, "acme")
    _, lapsed_id = create_key(ini, capsys, "gamma")
    ok(keys_cli(ini, capsys, "org-tags", "acme", "--set", "eu,gold"))
    ok(keys_cli(ini, capsys, "org-tags", "beta", "--set", "trial"))
    assignments = ("test_rpm=100", "test_rpm@chat-a=50", "test_budget@chat-a=5")
    ok(keys_cli(ini, capsys, "org-set", "acme", *assignments))
    ok(keys_cli(ini, capsys, "set", own_id, "test_rpm=10", "test_rpm@chat-a=5", "test_mode=soft"))
    ok(keys_cli(ini, capsys, "set", gone_id, "test_mode=hard"))
    ok(keys_cli(ini, capsys, "revoke", gone_id))
    ok(keys_cli(ini, capsys, "revoke", lapsed_id))
    # Stored under declarations since changed: left out, as for calls.
    raw.update_org_settings("acme", {"legacy_cap": "7"})
    return Made(own, own_id, plain, plain_id, gone, gone_id, lapsed_id)


async def check_answers(principals: Principals, made: Made) -> list[Principal | None]:
    """What every test expects, whichever way the answers were found; returns them all."""
    acme = await principals.organisation("acme")
    assert acme == Principal(org="acme", org_tags=ACME_TAGS, settings=ACME_SETTINGS)
    assert acme is not None and acme.key_id is None and not acme.key_settings
    assert await principals.organisation("beta") == Principal(
        org="beta", org_tags=frozenset({"trial"})
    )
    # Known while the key database has it, even with every key revoked.
    assert await principals.organisation("gamma") == Principal(org="gamma")
    assert await principals.organisation("nobody") is None
    assert await principals.organisation(made.own_id) is None

    own = await principals.key(made.own_id)
    assert own == Principal(
        key_id=made.own_id,
        org="acme",
        org_tags=ACME_TAGS,
        scopes=SCOPES,
        settings=ACME_SETTINGS,
        key_settings=OWN_SETTINGS,
    )
    plain = await principals.key(made.plain_id)
    assert plain == attrs.evolve(own, key_id=made.plain_id, key_settings={})
    for missing in (made.gone_id, made.lapsed_id, UNKNOWN_ID, "acme", made.own):
        assert await principals.key(missing) is None, missing

    answers = [acme, own, plain]
    for answer in answers:
        shown = f"{answer!r} {attrs.asdict(answer)!r}" if answer is not None else ""
        for key in made.keys:
            assert key not in shown and hash_key(key) not in shown
            assert key.split("-", 3)[3] not in shown  # the secret part alone either
    return answers


def unstarted(ini: Path, declares: DeclaresLimits) -> Generation:
    """The generation ``prism limits show`` builds from the configuration, never started."""
    generation: Generation = create_app(ini, plugins=[(declares, PLUGIN_NAME)])[GATEWAY].current
    assert generation.services.provider(PRINCIPALS) == "keys"
    return generation


def principals_of(generation: Generation) -> Principals:
    principals = generation.services.get(PRINCIPALS)
    assert isinstance(principals, Principals)
    return principals


def open_files(path: Path) -> list[str]:
    """What this process holds open of ``path`` (and its journal)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(path)):
                found.append(target)
    return found


# --- SQLite ---


async def test_sqlite_an_unstarted_generation_reads_the_file_and_closes_it(
    tmp_path, capsys, caplog, declares
):
    caplog.set_level(logging.INFO, logger="prism.keys")
    ini = write_ini(tmp_path, "db_path = keys.db\nrefresh_s = 300\n")
    made = populate(ini, capsys, KeyStore(tmp_path / "keys.db"))
    generation = unstarted(ini, declares)
    principals = principals_of(generation)
    declares.parsed.clear()  # the CLI's checks

    await check_answers(principals, made)
    assert declares.parsed  # parsed by the generation's declarations, not taken as stored
    ring = ring_of(generation)
    assert ring is not None and not ring.loaded  # read without loading the ring
    assert open_files(tmp_path / "keys.db") == []
    # A setting no declaration accepts is left out and named in the log; no value, no key.
    assert "organisation setting 'legacy_cap' (set for 'acme')" in caplog.text
    assert all(key not in caplog.text for key in made.keys)


async def test_sqlite_without_a_database_file_nobody_is_known_and_no_file_is_made(
    tmp_path, declares
):
    ini = write_ini(tmp_path, "db_path = keys.db\n")
    principals = principals_of(unstarted(ini, declares))
    assert await principals.organisation("acme") is None
    assert await principals.key(UNKNOWN_ID) is None
    assert not (tmp_path / "keys.db").exists()


async def test_sqlite_a_serving_gateway_answers_what_its_calls_carry(
    prism_fake, prism_gateway, prism_plugin, tmp_path, capsys, declares
):
    prism_plugin(declares, PLUGIN_NAME)
    ini = write_ini(tmp_path, "db_path = keys.db\n")
    made = populate(ini, capsys, KeyStore(tmp_path / "keys.db"))
    # Re-read only when the test says so (refresh_now).
    gw = await start(prism_gateway, prism_fake, tmp_path, {"db_path": "keys.db", "refresh_s": 300})
    await answers_follow_the_ring(gw, ini, capsys, made, declares)


async def answers_follow_the_ring(
    gw: Any, ini: Path, capsys: pytest.CaptureFixture[str], made: Made, declares: DeclaresLimits
) -> None:
    generation = gw.gateway.current
    principals = principals_of(generation)
    _, own, _ = await check_answers(principals, made)
    # The very principal a call with the key carries.
    assert await seen_rpm(gw, made.own, "chat-a") == ("10/5", "100/50")
    assert own is not None and declares.seen[-1] == (dict(own.key_settings), dict(own.settings))

    # From the ring: a change counts once the gateway has read it, as for calls.
    ring = ring_of(generation)
    assert ring is not None and ring.loaded
    ok(keys_cli(ini, capsys, "revoke", made.plain_id))
    ok(keys_cli(ini, capsys, "org-set", "acme", "test_rpm=200"))
    await ring.refresh_now()
    assert await principals.key(made.plain_id) is None
    acme = await principals.organisation("acme")
    assert acme is not None and acme.settings["test_rpm"] == 200


# --- PostgreSQL ---


async def other_connections(url: str) -> int:
    """Connections to the test's database other than the one asking."""
    conn = await asyncpg.connect(url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    finally:
        await conn.close()


async def no_other_connections(url: str) -> None:
    # A closed connection's server process goes a moment after the client is told.
    deadline = time.monotonic() + 5
    while (count := await other_connections(url)) != 0:
        assert time.monotonic() < deadline, f"{count} connections left open"
        await asyncio.sleep(0.02)


async def test_postgres_an_unstarted_generation_reads_on_its_own_connection_and_closes_it(
    prism_postgres, tmp_path, capsys, declares
):
    ini = write_ini(tmp_path, f"db_url = {prism_postgres}\n")
    made = populate(ini, capsys, SyncPgKeyStore(prism_postgres))
    generation = unstarted(ini, declares)
    await check_answers(principals_of(generation), made)
    ring = ring_of(generation)
    assert ring is not None and not ring.loaded
    await no_other_connections(prism_postgres)


async def test_postgres_without_the_tables_nobody_is_known_and_none_are_made(
    prism_postgres, tmp_path, declares
):
    ini = write_ini(tmp_path, f"db_url = {prism_postgres}\n")
    principals = principals_of(unstarted(ini, declares))
    assert await principals.organisation("acme") is None
    assert await principals.key(UNKNOWN_ID) is None
    conn = await asyncpg.connect(prism_postgres)
    try:
        assert await conn.fetchval("SELECT to_regclass('prism_keys_orgs')") is None
    finally:
        await conn.close()


async def test_postgres_a_serving_gateway_answers_what_its_calls_carry(
    prism_postgres, prism_fake, prism_gateway, prism_plugin, tmp_path, capsys, declares
):
    # prism_postgres first: its database is dropped after the gateway stopped.
    prism_plugin(declares, PLUGIN_NAME)
    ini = write_ini(tmp_path, f"db_url = {prism_postgres}\n")
    made = populate(ini, capsys, SyncPgKeyStore(prism_postgres))
    gw = await start(
        prism_gateway, prism_fake, tmp_path, {"db_url": prism_postgres, "refresh_s": 300}
    )
    await answers_follow_the_ring(gw, ini, capsys, made, declares)
