"""The ledger writer on its own: group commit, idempotency, and closing."""

from __future__ import annotations

import asyncio
import sqlite3
import types

import attrs
import pytest
from aiohttp import web
from prism_billing import LedgerRow, LedgerWriter
from prism_billing.ledger import LedgerClosed

from prism_proxy import ConfigError, Telemetry, config_from_mapping, create_app


def row(request_id: str, **changes: object) -> LedgerRow:
    base = LedgerRow(
        request_id=request_id,
        ts="2026-11-01T10:00:00.000Z",
        day="2026-11-01",
        key_id="k",
        org="o",
        model="m",
        endpoint="chat",
        stream=False,
        traffic="customer",
        outcome="ok",
        status=200,
        error_code=None,
        provider="p",
        upstream_model="x",
        input_tokens=1,
        cached_input_tokens=0,
        cache_creation_tokens=0,
        output_tokens=1,
        estimated=False,
        unpriced=False,
        cost_nanos=18,
        attempts=1,
        duration_ms=5,
    )
    return attrs.evolve(base, **changes)


def calls_in_flight(count: int) -> types.SimpleNamespace:
    """What a writer serves: a generation with ``count`` calls in flight."""
    return types.SimpleNamespace(in_flight=count, telemetry=Telemetry())


def stored(path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT request_id, outcome FROM ledger ORDER BY request_id").fetchall()
    finally:
        conn.close()


async def test_rows_queued_together_share_one_commit(tmp_path):
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    await asyncio.gather(*(writer.record(row(f"req_{i:02d}")) for i in range(50)))
    await writer.close()
    assert writer.counters["billing_rows"] == 50
    assert writer.counters["billing_commits"] == 1
    assert len(stored(tmp_path / "l.sqlite")) == 50


async def test_every_value_reads_back_as_written_absent_ones_as_null(tmp_path):
    """None is NULL, flags are 0 and 1, and every other value is itself, in one batch."""
    from prism_billing.rows import COLUMNS

    full = row(
        "req_full",
        stream=True,
        estimated=True,
        unpriced=True,
        usage_suspect=True,
        error_code="upstream_error",
        region="eu-west-1",
        status=502,
        input_tokens=0,
        output_tokens=1,
    )
    empty = row("req_none", key_id=None, org=None, provider=None, upstream_model=None, status=400)
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    try:
        await asyncio.gather(writer.record(full), writer.record(empty))
    finally:
        await writer.close()
    conn = sqlite3.connect(tmp_path / "l.sqlite")
    try:
        got = conn.execute(
            f"SELECT {', '.join(COLUMNS)} FROM ledger ORDER BY request_id"
        ).fetchall()
        nulls = conn.execute(
            "SELECT COUNT(*) FROM ledger WHERE key_id IS NULL AND org IS NULL"
            " AND error_code IS NULL AND provider IS NULL AND upstream_model IS NULL"
            " AND region IS NULL"
        ).fetchone()[0]
    finally:
        conn.close()
    expected = [
        tuple(int(v) if isinstance(v, bool) else v for v in r.as_tuple()) for r in (full, empty)
    ]
    assert got == expected
    assert nulls == 1


async def test_the_ledger_is_in_wal_mode_with_full_sync(tmp_path):
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    await writer.record(row("req_1"))
    await writer.close()
    conn = sqlite3.connect(tmp_path / "l.sqlite")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


async def test_a_request_id_is_written_once_whatever_comes_later(tmp_path):
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    await writer.record(row("req_1"))
    await asyncio.gather(
        writer.record(row("req_1", outcome="aborted")), writer.record(row("req_2"))
    )
    await writer.close()
    assert stored(tmp_path / "l.sqlite") == [("req_1", "ok"), ("req_2", "ok")]
    assert writer.counters["billing_rows"] == 2


async def test_a_closed_ledger_refuses_rows_loudly(tmp_path):
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    await writer.close()
    with pytest.raises(LedgerClosed):
        await writer.record(row("req_late"))


async def test_a_ledger_from_a_newer_version_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "l.sqlite")
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    writer = LedgerWriter(tmp_path / "l.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="newer"):
        await writer.start()
    await writer.close()


async def test_a_gateway_that_cannot_open_its_ledger_does_not_start(prism_fake, tmp_path):
    (tmp_path / "l.sqlite").write_bytes(b"this is not a database, just some text" * 100)
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {
            "m": {"chain": [{"provider": "p", "model": "x", "price": {"input": 1, "output": 1}}]}
        },
    }
    config = config_from_mapping(
        {}, {"billing": {"ledger_path": str(tmp_path / "l.sqlite")}}, catalog_data=catalog
    )
    runner = web.AppRunner(create_app(config))
    with pytest.raises(ConfigError) as info:
        await runner.setup()
    await runner.cleanup()
    assert info.value.key == "[prism:billing] ledger_path"
    assert "cannot open the ledger" in info.value.problem


async def test_a_failed_commit_fails_its_callers_and_the_next_batch_still_commits(tmp_path):
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    with pytest.raises(OverflowError):
        await writer.record(row("req_bad", cost_nanos=2**70))
    await writer.record(row("req_good"))
    await writer.close()
    assert stored(tmp_path / "l.sqlite") == [("req_good", "ok")]
    assert writer.counters["billing_write_errors"] == 1


async def test_a_commit_waits_a_moment_for_the_rows_of_calls_still_in_flight(tmp_path):
    loop = asyncio.get_running_loop()
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    gateway = calls_in_flight(4)

    async def staggered(prefix: str, spacing_s: float) -> None:
        async def call(i: int) -> None:
            await asyncio.sleep(spacing_s * i)
            await writer.record(row(f"{prefix}_{i}"))

        await asyncio.gather(*(call(i) for i in range(4)))

    try:
        # Without a delay, calls settling 0.2 s apart commit one by one.
        writer.serve(gateway, 0.0)
        await staggered("apart", 0.2)
        assert writer.counters["billing_commits"] == 4
        # Four calls in flight, settling within the delay: one commit for the four.
        writer.serve(gateway, 1.0)
        await staggered("shared", 0.05)
        assert writer.counters["billing_commits"] == 5
        # A call alone waits for nobody.
        gateway.in_flight = 1
        started = loop.time()
        await writer.record(row("alone"))
        assert loop.time() - started < 0.9
        assert writer.counters["billing_commits"] == 6
    finally:
        await writer.close()
    assert len(stored(tmp_path / "l.sqlite")) == 9


async def test_a_commit_waits_no_longer_than_the_calls_in_flight_take_to_queue(tmp_path):
    """Once every call in flight has queued its row, the commit goes: nothing else is coming."""
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    gateway = calls_in_flight(3)
    # A delay far beyond the test's patience: only the early commit can finish in time.
    writer.serve(gateway, 60.0)
    try:
        first = writer.record(row("first"))
        await asyncio.sleep(0)  # the writer starts waiting for the other two rows
        async with asyncio.timeout(10):
            await asyncio.gather(first, writer.record(row("second")), writer.record(row("third")))
        assert writer.counters["billing_commits"] == 1
    finally:
        await writer.close()
    assert len(stored(tmp_path / "l.sqlite")) == 3


async def test_a_row_queued_as_the_delay_runs_out_joins_that_commit(tmp_path):
    """The delay's end and a call's row can land in one turn of the loop, in that order."""
    import time

    loop = asyncio.get_running_loop()
    writer = LedgerWriter(tmp_path / "l.sqlite")
    await writer.start()
    # Two calls in flight: the second's row is the last one coming, so it ends the wait.
    writer.serve(calls_in_flight(2), 0.05)
    try:
        recorded = [writer.record(row("first"))]
        for _ in range(20):  # until the writer waits for the others' rows
            if writer._waiting:
                break
            await asyncio.sleep(0)
        assert writer._waiting
        loop.call_later(0.05, lambda: recorded.append(writer.record(row("second"))))
        # Block the loop past both deadlines: the delay's timer and the row's run in one pass.
        time.sleep(0.1)
        async with asyncio.timeout(10):
            await asyncio.sleep(0.01)
            assert len(recorded) == 2, "recording the second row failed"
            await asyncio.gather(*recorded)
        assert writer.counters["billing_commits"] == 1
    finally:
        await writer.close()
    assert len(stored(tmp_path / "l.sqlite")) == 2


def test_a_batch_larger_than_one_statement_is_still_one_transaction(tmp_path):
    from prism_billing.ledger import _write, connect

    conn = connect(tmp_path / "l.sqlite")
    try:
        # Two rows' worth of parameters per statement: five rows are three statements.
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 2 * len(row("x").as_tuple()))
        rows = [row(f"req_{i}").as_tuple() for i in range(5)]
        assert _write(conn, [*rows, rows[0]]) == 5  # the repeat is ignored, not an error
        # A bad row in the second statement takes the first statement's rows back with it.
        batch = [row(f"req_{i}").as_tuple() for i in (5, 6)] + [row("req_7", org={}).as_tuple()]
        with pytest.raises(sqlite3.Error):
            _write(conn, batch)
        assert not conn.in_transaction
    finally:
        conn.close()
    assert [r for r, _ in stored(tmp_path / "l.sqlite")] == [f"req_{i}" for i in range(5)]
