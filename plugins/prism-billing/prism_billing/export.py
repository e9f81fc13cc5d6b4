"""``prism ledger export``: ledger rows as CSV or JSON lines, from the SQLite file or PostgreSQL."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import asyncpg

from prism_proxy import Commands, Config, ConfigError

from .ledger import open_for_reading
from .queries import (
    EXPORT_FIELDS,
    TRAFFIC_KINDS,
    Filters,
    export_rows,
    parse_day,
    pg_export_rows,
)
from .settings import PLUGIN_NAME, BillingSettings

__all__ = ["add_ledger_command", "run_ledger"]


def _day(value: str) -> str:
    try:
        return parse_day(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_ledger_command(commands: Commands) -> None:
    parser = commands.add("ledger", "read the billing ledger: `prism ledger export`", run_ledger)
    parser.add_argument("action", choices=["export"], help="what to do with the ledger")
    parser.add_argument(
        "--since",
        type=_day,
        metavar="YYYY-MM-DD",
        help="first UTC day (inclusive; default: the ledger's first row)",
    )
    parser.add_argument(
        "--until", type=_day, metavar="YYYY-MM-DD", help="UTC day to stop before (exclusive)"
    )
    parser.add_argument("--format", choices=["csv", "jsonl"], default="csv")
    parser.add_argument("--output", metavar="PATH", help="file to write (default: stdout)")
    parser.add_argument(
        "--traffic",
        choices=[*TRAFFIC_KINDS, "all"],
        default="customer",
        help="which traffic to export (default: customer; probes never reach a bill)",
    )
    parser.add_argument("--key", help="only this key id")
    parser.add_argument("--org", help="only this organisation")
    parser.add_argument("--model", help="only this model (as the caller asked for it)")


def _filters(args: argparse.Namespace) -> Filters:
    return Filters(
        since=args.since,
        until=args.until,
        traffic=None if args.traffic == "all" else args.traffic,
        key_id=args.key,
        org=args.org,
        model=args.model,
    )


def run_ledger(args: argparse.Namespace, config: Config) -> int:
    settings = BillingSettings.from_config(config, check_dir=False)
    if settings.ledger_url is not None:
        return _run_pg(args, settings.ledger_url, settings.ledger_name)
    where = f"[prism:{PLUGIN_NAME}] ledger_path"
    if settings.ledger_path is None:
        raise ConfigError(
            config.source,
            where,
            "not set (nor ledger_url): billing is off, there is no ledger",
        )
    try:
        conn = open_for_reading(settings.ledger_path)
    except FileNotFoundError:
        raise ConfigError(config.source, where, f"no ledger at {settings.ledger_path}") from None
    try:
        with _output(args.output) as out:
            count = _write(out, args.format, export_rows(conn, _filters(args)))
            out.flush()  # a closed pipe shows here, not at exit
    except sqlite3.DatabaseError as exc:
        print(f"prism ledger export: cannot read {settings.ledger_path}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return _reader_left(args)
    finally:
        conn.close()
    if args.output:
        print(f"exported {count} rows to {args.output}", file=sys.stderr)
    return 0


def _run_pg(args: argparse.Namespace, url: str, name: str) -> int:
    """The export from a PostgreSQL ledger (``name``: the URL without its password)."""
    try:
        with _output(args.output) as out:
            count = asyncio.run(_export_pg(url, args.format, _filters(args), out))
            out.flush()
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _reader_left(args)
        print(
            f"prism ledger export: cannot read {name}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    if args.output:
        print(f"exported {count} rows to {args.output}", file=sys.stderr)
    return 0


async def _export_pg(url: str, fmt: str, filters: Filters, out: IO[str]) -> int:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        sink = _Sink(out, fmt)
        rows: AsyncIterator[dict[str, Any]] = pg_export_rows(conn, filters)
        async for row in rows:
            sink.write(row)
        return sink.count
    finally:
        await conn.close()


def _reader_left(args: argparse.Namespace) -> int:
    """The reader left (`prism ledger export | head -1`): stop quietly.

    As Python's docs advise, stdout now goes to devnull, so the flush at exit
    cannot fail again.
    """
    if args.output is None:
        with contextlib.suppress(OSError):  # a stdout without a file descriptor
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    return 1


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    with Path(path).open("w", encoding="utf-8", newline="") as out:
        yield out


class _Sink:
    """Writes rows one at a time in the chosen format (CSV starts with its header)."""

    def __init__(self, out: IO[str], fmt: str) -> None:
        self.out = out
        self.count = 0
        self.csv: csv.DictWriter[str] | None = None
        if fmt == "csv":
            self.csv = csv.DictWriter(out, fieldnames=EXPORT_FIELDS, lineterminator="\n")
            self.csv.writeheader()

    def write(self, row: dict[str, object]) -> None:
        if self.csv is not None:
            # Flags as JSON and SQL spell them, not Python's True/False.
            self.csv.writerow(
                {k: _csv_flag(v) if isinstance(v, bool) else v for k, v in row.items()}
            )
        else:
            self.out.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.count += 1


def _write(out: IO[str], fmt: str, rows: Iterator[dict[str, object]]) -> int:
    sink = _Sink(out, fmt)
    for row in rows:
        sink.write(row)
    return sink.count


def _csv_flag(value: bool) -> str:
    return "true" if value else "false"
