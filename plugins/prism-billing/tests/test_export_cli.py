"""`prism ledger export` as a shell user runs it: no --since, CSV flags, a reader that leaves."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from prism_billing.ledger import connect
from prism_billing.rows import COLUMNS, LedgerRow

from prism_proxy.cli import main


def row(number: int, day: str, *, stream: bool = False, traffic: str = "customer") -> LedgerRow:
    return LedgerRow(
        request_id=f"req-{number:06d}",
        ts=f"{day}T12:00:00.{number % 1000:03d}Z",
        day=day,
        key_id="k1",
        org="acme",
        model="m",
        endpoint="chat",
        stream=stream,
        traffic=traffic,
        outcome="ok",
        status=200,
        error_code=None,
        provider="alpha",
        upstream_model="up-alpha",
        input_tokens=2,
        cached_input_tokens=0,
        cache_creation_tokens=0,
        output_tokens=9,
        estimated=True,
        unpriced=False,
        cost_nanos=20_000,
        attempts=1,
        duration_ms=5,
    )


def write_ledger(directory: Path, rows: list[LedgerRow]) -> str:
    """A ledger file holding ``rows`` and the prism.ini that names it."""
    conn = connect(directory / "ledger.sqlite")
    try:
        columns = ", ".join(COLUMNS)
        marks = ", ".join("?" for _ in COLUMNS)
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO ledger ({columns}) VALUES ({marks})", [r.as_tuple() for r in rows]
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    ini = directory / "prism.ini"
    ini.write_text(
        "[prism]\ncatalog = catalog.toml\n\n[prism:billing]\nledger_path = ledger.sqlite\n"
    )
    return str(ini)


def test_export_without_since_is_the_whole_ledger(tmp_path, capsys):
    ini = write_ledger(
        tmp_path,
        [row(1, "2025-01-31"), row(2, "2026-11-01"), row(3, "2026-11-02", traffic="probe")],
    )
    assert main(["ledger", "export", "--config", ini, "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["request_id"] for r in rows] == ["req-000001", "req-000002"]
    assert main(["ledger", "export", "--config", ini, "--until", "2026-01-01"]) == 0
    exported = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["request_id"] for r in exported] == ["req-000001"]


def test_csv_flags_are_true_and_false(tmp_path, capsys):
    ini = write_ledger(tmp_path, [row(1, "2026-11-01", stream=True), row(2, "2026-11-02")])
    assert main(["ledger", "export", "--config", ini, "--since", "2026-11-01"]) == 0
    exported = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    flags = [(r["stream"], r["estimated"], r["unpriced"], r["usage_suspect"]) for r in exported]
    assert flags == [("true", "true", "false", "false"), ("false", "true", "false", "false")]
    assert exported[0]["cost"] == "0.00002"


def test_a_reader_that_leaves_ends_the_export_quietly(tmp_path):
    # Far more than a pipe's buffer (64 KiB), so the export is still writing when the reader goes.
    ini = write_ledger(tmp_path, [row(n, "2026-11-01") for n in range(5000)])
    command = ["ledger", "export", "--config", ini, "--since", "2026-11-01"]
    process = subprocess.Popen(
        [sys.executable, "-m", "prism_proxy.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"request_id,ts,day,")  # `| head -1`
    process.stdout.close()
    assert process.wait(timeout=30) == 1
    assert process.stderr.read() == b""
