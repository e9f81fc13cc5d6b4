"""``prism ledger export``: ledger rows as CSV or JSON lines, read from the SQLite file."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from prism_proxy import Commands, Config, ConfigError

from .ledger import open_for_reading
from .queries import EXPORT_FIELDS, TRAFFIC_KINDS, Filters, export_rows, parse_day
from .settings import PLUGIN_NAME, BillingSettings

__all__ = ["add_ledger_command", "run_ledger"]


def _day(value: str) -> str:
    try:
        return parse_day(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_ledger_command(commands: Commands) -> None:
    parser = commands.add(
        "ledger", "read the billing ledger: `prism ledger export --since YYYY-MM-DD`", run_ledger
    )
    parser.add_argument("action", choices=["export"], help="what to do with the ledger")
    parser.add_argument(
        "--since", required=True, type=_day, metavar="YYYY-MM-DD", help="first UTC day (inclusive)"
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


def run_ledger(args: argparse.Namespace, config: Config) -> int:
    settings = BillingSettings.from_config(config, check_dir=False)
    where = f"[prism:{PLUGIN_NAME}] ledger_path"
    if settings.ledger_path is None:
        raise ConfigError(config.source, where, "not set: billing is off, there is no ledger")
    try:
        conn = open_for_reading(settings.ledger_path)
    except FileNotFoundError:
        raise ConfigError(config.source, where, f"no ledger at {settings.ledger_path}") from None
    filters = Filters(
        since=args.since,
        until=args.until,
        traffic=None if args.traffic == "all" else args.traffic,
        key_id=args.key,
        org=args.org,
        model=args.model,
    )
    try:
        with _output(args.output) as out:
            count = _write(out, args.format, export_rows(conn, filters))
    except sqlite3.DatabaseError as exc:
        print(f"prism ledger export: cannot read {settings.ledger_path}: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if args.output:
        print(f"exported {count} rows to {args.output}", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    with Path(path).open("w", encoding="utf-8", newline="") as out:
        yield out


def _write(out: IO[str], fmt: str, rows: Iterator[dict[str, object]]) -> int:
    count = 0
    if fmt == "csv":
        writer = csv.DictWriter(out, fieldnames=EXPORT_FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
            count += 1
    else:
        for row in rows:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
            count += 1
    return count
