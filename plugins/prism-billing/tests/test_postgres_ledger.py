"""The PostgreSQL ledger (``ledger_url``): the SQLite ledger's contract, on a shared database.

Each test gets a database of its own (random name) on the server at
127.0.0.1:5432 and drops it at the end, whatever happened.  Rows are read back
with a plain asyncpg connection, as an auditor would.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import attrs
import pytest
from aiohttp import web
from prism_billing import billing_of
from prism_billing.ledger import LedgerClosed
from prism_billing.pg_ledger import PG_SCHEMA_VERSION, PostgresLedgerWriter
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, config_from_mapping, create_app, redact_url
from prism_proxy.cli import main

from .conftest import ADMIN_ENV, ADMIN_TOKEN, PRICE_A, KeyAuth, expected_cost, priced_catalog
from .test_billing import MESSAGES, TEXT, Captured, chat
from .test_ledger_writer import row

SERVER = "postgresql://postgres@127.0.0.1:5432"


async def _admin() -> asyncpg.Connection:
    return await asyncpg.connect(f"{SERVER}/postgres", timeout=5)


@pytest.fixture
def pg_url(prism_postgres: str) -> str:
    return prism_postgres


async def rows_in(url: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        return [dict(r) for r in await conn.fetch("SELECT * FROM ledger ORDER BY ts, request_id")]
    finally:
        await conn.close()


@pytest.fixture
def pg_gateway(
    pg_url: str, prism_gateway: Any, prism_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> Any:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    prism_plugin(KeyAuth(), "test-key-auth")

    async def start(catalog: dict, **billing: Any) -> Any:
        section = {"ledger_url": pg_url, **billing}
        return await prism_gateway(
            catalog, config={"admin_token_env": ADMIN_ENV}, sections={"billing": section}
        )

    return start


async def stats(gw: Any) -> dict[str, int]:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/stats") as response:
            counters: dict[str, int] = (await response.json())["counters"]
            return counters


async def test_the_row_is_in_postgresql_before_the_response_completes(
    prism_fake, pg_gateway, pg_url
):
    prism_fake.script("alpha", [Fault(text=TEXT)])
    gw = await pg_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    raw = await chat(gw, headers={"x-test-key": "key-7@acme"})
    # No waiting: the row committed before the body was sent.
    (stored,) = await rows_in(pg_url)
    assert stored["request_id"] == raw.headers["x-prism-request-id"]
    assert (stored["model"], stored["provider"], stored["upstream_model"]) == (
        "m",
        "alpha",
        "up-alpha",
    )
    assert (stored["key_id"], stored["org"], stored["outcome"], stored["stream"]) == (
        "key-7",
        "acme",
        "ok",
        False,
    )
    assert (stored["input_tokens"], stored["output_tokens"], stored["estimated"]) == (2, 10, False)
    cost = expected_cost(PRICE_A, 2, 10)
    assert Decimal(stored["cost_nanos"]).scaleb(-9) == cost
    assert Decimal(raw.headers["x-prism-cost"]) == cost
    # The same timestamp strings as the SQLite ledger writes.
    assert stored["ts"].endswith("Z") and stored["ts"].startswith(stored["day"] + "T")


async def test_a_stream_row_is_committed_before_the_final_event(prism_fake, pg_gateway, pg_url):
    gw = await pg_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
        ) as response:
            seen_rows = None
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    seen_rows = await rows_in(pg_url)
    assert seen_rows is not None and len(seen_rows) == 1
    assert seen_rows[0]["stream"] is True


async def test_settling_twice_leaves_one_row(prism_fake, pg_gateway, pg_url, prism_plugin):
    captured = Captured()
    prism_plugin(captured, "test-captured")
    gw = await pg_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    await chat(gw)
    ((call, settlement),) = captured.seen
    first = await rows_in(pg_url)
    billing = billing_of(gw.gateway.current)
    assert billing is not None
    await billing.prism_settle(call=call, settlement=settlement)
    aborted = attrs.evolve(settlement, outcome="aborted", status=499, error_code="client_closed")
    await billing.prism_settle(call=call, settlement=aborted)
    assert await rows_in(pg_url) == first


async def test_one_row_per_request_id_across_writers_and_within_a_batch(pg_url):
    # Two writers on one database: two replicas settling the same request.
    one, two = PostgresLedgerWriter(pg_url), PostgresLedgerWriter(pg_url)
    await one.start()
    await two.start()
    try:
        await one.record(row("req_1"))
        await asyncio.gather(
            two.record(row("req_1", outcome="aborted")),
            two.record(row("req_2")),
            two.record(row("req_2", outcome="error")),
        )
    finally:
        await one.close()
        await two.close()
    assert [(r["request_id"], r["outcome"]) for r in await rows_in(pg_url)] == [
        ("req_1", "ok"),
        ("req_2", "ok"),
    ]
    assert (one.counters["billing_rows"], two.counters["billing_rows"]) == (1, 1)


async def test_concurrent_calls_share_commits(prism_fake, pg_gateway, pg_url):
    prism_fake.script("alpha", [Fault(first_token_delay_s=0.1)] * 30)
    gw = await pg_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    async with gw.openai() as client:
        await asyncio.gather(
            *(client.chat.completions.create(model="m", messages=MESSAGES) for _ in range(30))
        )
    assert len(await rows_in(pg_url)) == 30
    counters = await stats(gw)
    assert counters["billing_rows"] == 30
    assert counters["billing_commits"] < 30


async def test_rows_queued_together_share_one_commit(pg_url):
    writer = PostgresLedgerWriter(pg_url)
    await writer.start()
    await asyncio.gather(*(writer.record(row(f"req_{i:02d}")) for i in range(50)))
    await writer.close()
    assert (writer.counters["billing_rows"], writer.counters["billing_commits"]) == (50, 1)
    assert len(await rows_in(pg_url)) == 50
    with pytest.raises(LedgerClosed):
        await writer.record(row("req_late"))


async def test_the_schema_is_created_on_a_fresh_database_and_reused(pg_url):
    writer = PostgresLedgerWriter(pg_url)
    await writer.start()
    await writer.record(row("req_1"))
    await writer.close()
    again = PostgresLedgerWriter(pg_url)
    await again.start()
    await again.record(row("req_2"))
    await again.close()
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM prism_ledger_schema") == 1
        assert await conn.fetchval("SELECT version FROM prism_ledger_schema") == PG_SCHEMA_VERSION
        types = dict(
            await conn.fetch(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'ledger'"
            )
        )
    finally:
        await conn.close()
    assert [r["request_id"] for r in await rows_in(pg_url)] == ["req_1", "req_2"]
    assert (types["cost_nanos"], types["stream"], types["ts"]) == ("bigint", "boolean", "text")


async def test_a_ledger_from_a_newer_version_is_refused(pg_url):
    writer = PostgresLedgerWriter(pg_url)
    await writer.start()
    await writer.close()
    conn = await asyncpg.connect(pg_url)
    await conn.execute("UPDATE prism_ledger_schema SET version = 99")
    await conn.close()
    catalog = {"providers": {}, "models": {}}
    config = config_from_mapping({}, {"billing": {"ledger_url": pg_url}}, catalog_data=catalog)
    runner = web.AppRunner(create_app(config))
    with pytest.raises(ConfigError) as info:
        await runner.setup()
    await runner.cleanup()
    assert info.value.key == "[prism:billing] ledger_url"
    assert "newer" in info.value.problem


async def test_a_failed_commit_fails_its_batch_and_the_next_batch_commits(pg_url):
    writer = PostgresLedgerWriter(pg_url)
    await writer.start()
    try:
        with pytest.raises(asyncpg.DataError):
            await writer.record(row("req_bad", cost_nanos=2**70))  # beyond BIGINT
        await writer.record(row("req_good"))
    finally:
        await writer.close()
    assert [r["request_id"] for r in await rows_in(pg_url)] == ["req_good"]
    assert writer.counters["billing_write_errors"] == 1


async def _ledger_gone(url: str) -> None:
    """As if PostgreSQL went away: connections cut, no new ones accepted."""
    name = url.rsplit("/", 1)[1]
    admin = await _admin()
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
    finally:
        await admin.close()


async def ledger_state(gw: Any, state: str, timeout_s: float = 15.0) -> dict[str, Any]:
    """Wait until ``/readyz`` says the ledger is in ``state``; its facts then."""
    async with aiohttp.ClientSession() as session, asyncio.timeout(timeout_s):
        while True:
            async with session.get(gw.url + "/readyz") as response:
                assert response.status == 200
                facts: dict[str, Any] = (await response.json())["ledger"]
            if facts["state"] == state:
                return facts
            await asyncio.sleep(0.05)


async def _ledger_back(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin = await _admin()
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    finally:
        await admin.close()


SECRET_TEXT = "only the ledger stands between this text and the caller"


async def test_postgresql_gone_fails_closed_and_billing_resumes_when_it_is_back(
    prism_fake, pg_gateway, pg_url
):
    prism_fake.script("alpha", [Fault(text=SECRET_TEXT)] * 4)
    gw = await pg_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    await chat(gw)
    await _ledger_gone(pg_url)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
        ) as response:
            body = await response.text()
            assert response.status == 503
            assert "x-prism-cost" not in response.headers
        assert json.loads(body)["error"]["code"] == "settlement_failed"
        assert SECRET_TEXT not in body
        # Known down, and no spool: the next call, a stream, is refused before any
        # provider is called, rather than served and then left without its row.
        hits = prism_fake.hits("alpha")
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
        ) as response:
            assert response.status == 503
            assert (await response.json())["error"]["code"] == "ledger_unavailable"
        assert prism_fake.hits("alpha") == hits
        counters = await stats(gw)
        assert counters["billing_write_errors"] >= 1 and counters["billing_refusals"] >= 1
        await _ledger_back(pg_url)
        await ledger_state(gw, "ok")
        async with session.post(
            gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
        ) as response:
            assert response.status == 200
            assert SECRET_TEXT in await response.text()
            recovered = response.headers["x-prism-request-id"]
            assert "x-prism-cost" in response.headers
    ids = [r["request_id"] for r in await rows_in(pg_url)]
    assert len(ids) == 2 and ids[-1] == recovered


async def test_usage_and_export_read_the_postgresql_ledger(
    prism_fake, pg_gateway, pg_url, tmp_path: Path
):
    gw = await pg_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    await chat(gw, headers={"x-test-key": "k1@acme"})
    await chat(gw, headers={"x-test-key": "k2@acme"})
    await chat(gw, headers={"x-test-key": "k3@globex"})
    await chat(gw, headers={"x-test-key": "k3@globex", "x-test-traffic": "probe"})
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + "/prism/usage?group_by=org,binding",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response:
            assert response.status == 200, await response.text()
            usage = await response.json()
    one = expected_cost(PRICE_A, 2, 9)  # the fake answers with 9 completion tokens
    assert [(g["org"], g["binding"], g["calls"]) for g in usage["groups"]] == [
        ("acme", "alpha/up-alpha", 2),
        ("globex", "alpha/up-alpha", 1),
    ]
    assert usage["total"]["calls"] == 3 and usage["total"]["estimated_calls"] == 0
    assert Decimal(usage["total"]["cost"]) == 3 * one

    ini = tmp_path / "prism.ini"
    ini.write_text(f"[prism]\ncatalog = catalog.toml\n\n[prism:billing]\nledger_url = {pg_url}\n")
    out = tmp_path / "export.jsonl"
    command = ["ledger", "export", "--config", str(ini), "--format", "jsonl", "--output", str(out)]
    assert await asyncio.to_thread(main, command) == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["key_id"] for r in exported) == ["k1", "k2", "k3"]
    assert all(r["stream"] is False and r["cost"] == str(one) for r in exported)
    csv_out = tmp_path / "export.csv"
    command = [*command[:4], "--traffic", "all", "--output", str(csv_out)]
    assert await asyncio.to_thread(main, command) == 0
    lines = csv_out.read_text().splitlines()
    assert lines[0].startswith("request_id,ts,day,") and len(lines) == 5
    assert ",false," in lines[1] and "True" not in csv_out.read_text()


def test_both_ledger_keys_is_a_config_error():
    from prism_billing.settings import BillingSettings

    config = config_from_mapping(
        {},
        {"billing": {"ledger_path": "/tmp/l.sqlite", "ledger_url": f"{SERVER}/x"}},
        catalog_data={},
    )
    with pytest.raises(ConfigError) as info:
        BillingSettings.from_config(config)
    assert info.value.key == "[prism:billing] ledger_url"
    assert "both" in info.value.problem


@pytest.mark.parametrize(
    "url", ["mysql://root:hunter2@db/ledger", "127.0.0.1:5432/ledger", "postgresql://h:port/x"]
)
def test_a_bad_ledger_url_is_a_config_error_that_hides_the_password(url):
    from prism_billing.settings import BillingSettings

    config = config_from_mapping({}, {"billing": {"ledger_url": url}}, catalog_data={})
    with pytest.raises(ConfigError) as info:
        BillingSettings.from_config(config)
    assert info.value.key == "[prism:billing] ledger_url"
    assert "hunter2" not in str(info.value)


def test_redaction():
    assert redact_url("postgresql://u:s3cret@h:5432/d?x=1") == "postgresql://u:***@h:5432/d?x=1"
    assert redact_url("postgres://u@h/d") == "postgres://u@h/d"


async def test_a_gateway_that_cannot_open_its_ledger_does_not_start(pg_url):
    # Trust auth ignores the password, but it must never show; the database does not exist.
    url = pg_url.replace("postgres@", "postgres:s3cret@") + "_missing"
    catalog = {"providers": {}, "models": {}}
    config = config_from_mapping({}, {"billing": {"ledger_url": url}}, catalog_data=catalog)
    runner = web.AppRunner(create_app(config))
    with pytest.raises(ConfigError) as info:
        await runner.setup()
    await runner.cleanup()
    assert info.value.key == "[prism:billing] ledger_url"
    assert "cannot open the ledger" in info.value.problem
    assert "s3cret" not in str(info.value) and "postgres:***@" in info.value.problem
