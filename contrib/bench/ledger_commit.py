"""Ledger commit latency: how long ``record`` takes until the row is durable, SQLite vs PostgreSQL.

A call's answer completes only after its ledger row is committed, so this
latency is added to every billed call.  Both writers run in this process with
their defaults (SQLite: WAL, ``synchronous = FULL``; PostgreSQL: asyncpg
pool), one after the other, at concurrency 1 (every row its own commit) and
16 (rows share commits: group commit).  The PostgreSQL database is created
for the run and dropped after.

    python contrib/bench/ledger_commit.py [--rows 2000] [--postgres postgresql://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg
from prism_billing import LedgerRow, LedgerWriter, PostgresLedgerWriter
from prism_billing.ledger import GroupCommit


def row(request_id: str) -> LedgerRow:
    return LedgerRow(
        request_id=request_id,
        ts="2026-11-30T12:00:00.000Z",
        day="2026-11-30",
        key_id="key_bench",
        org="bench",
        model="m",
        endpoint="chat",
        stream=False,
        traffic="customer",
        outcome="ok",
        status=200,
        error_code=None,
        provider="p",
        upstream_model="up",
        input_tokens=12,
        cached_input_tokens=0,
        cache_creation_tokens=0,
        output_tokens=40,
        estimated=False,
        unpriced=False,
        cost_nanos=123_000,
        attempts=1,
        duration_ms=250,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


async def measure(writer: GroupCommit, rows: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    ids = iter(range(rows))

    async def worker() -> None:
        for i in ids:
            start = time.perf_counter()
            await writer.record(row(f"req_{concurrency}_{i}_{secrets.token_hex(4)}"))
            latencies.append((time.perf_counter() - start) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def main(rows: int, server: str) -> None:
    admin = await asyncpg.connect(f"{server}/postgres", timeout=5)
    name = f"prism_bench_{secrets.token_hex(4)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory() as scratch:
            writers: list[tuple[str, GroupCommit]] = [
                ("sqlite", LedgerWriter(Path(scratch) / "ledger.sqlite")),
                ("postgresql", PostgresLedgerWriter(f"{server}/{name}")),
            ]
            for label, writer in writers:
                await writer.start()  # type: ignore[attr-defined]
                try:
                    await measure(writer, 100, 4)  # warm-up: connections, pages, plans
                    for concurrency in (1, 16):
                        latencies = await measure(writer, rows, concurrency)
                        print(
                            f"{label:10} concurrency {concurrency:2d}: "
                            f"p50 {percentile(latencies, 0.50):6.2f} ms  "
                            f"p99 {percentile(latencies, 0.99):6.2f} ms  "
                            f"({rows} rows, {writer.counters['billing_commits']} commits so far)"
                        )
                finally:
                    await writer.close()  # type: ignore[attr-defined]
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=2000, help="rows per cell (2000)")
    parser.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432",
        help="the server (a database is created for the run and dropped)",
    )
    args = parser.parse_args(argv)
    asyncio.run(main(args.rows, args.postgres))


if __name__ == "__main__":
    cli()
