"""``prism capacity``: every limited line's in-flight peaks, and the k each tier alerts at.

The peaks live in the running gateway, so the command asks it
(``GET /prism/capacity`` at ``[prism] listen``, or ``--url``).
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from typing import Any

import orjson

from prism_proxy import Commands, Config

__all__ = ["add_commands", "format_report"]


def add_commands(commands: Commands) -> None:
    parser = commands.add(
        "capacity",
        "in-flight peaks per limited line and the capacity_k each tier would alert at",
        _run,
    )
    parser.add_argument("--url", help="the gateway (default: http://<[prism] listen>)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _run(args: argparse.Namespace, config: Config) -> int:
    listen = config.listen
    host = "127.0.0.1" if listen.host in ("0.0.0.0", "", "::") else listen.host
    base = args.url or f"http://{host}:{listen.port}"
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/prism/capacity", timeout=10) as response:
            report: dict[str, Any] = orjson.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        print(f"prism capacity: cannot ask the gateway at {base}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(format_report(report))
    return 0


def format_report(report: dict[str, Any]) -> str:
    minutes = round(report["window_s"] / 60)
    out = [f"in-flight peaks per minute over the last {minutes} min"]
    out.append(f"{'line':32} {'limit':>5} {'p50':>5} {'p95':>5} {'p99':>5} {'max':>5}")
    for line, p in report["lines"].items():
        out.append(
            f"{line:32} {p['max_concurrency']:5d} {p['p50']:5d} {p['p95']:5d} {p['p99']:5d} "
            f"{p['max']:5d}"
        )
    if not report["lines"]:
        # An empty table must not read as "no load": only limited lines are watched.
        out.append(
            "(none: no chain line of the gateway's catalog sets max_concurrency, and peaks "
            "are kept only for lines that do)"
        )
    k = report["k"]
    out.append("")
    out.append(f"capacity_k = {k:g}" if k is not None else "capacity_k is not set: the rule is off")
    if not report["tiers"]:
        out.append(
            "no tier to judge: the rule judges a model whose chain has two or more lines, "
            "every one with max_concurrency"
        )
    for tier in report["tiers"]:
        at = tier["alerts_above_k"]
        verdict = "no peak yet" if at is None else f"alerts for any k above {at:g}"
        out.append(f"tier {tier['model']}: {verdict}")
        for line, j in tier["lines"].items():
            ratio = "-" if j["ratio"] is None else f"{j['ratio']:.2f}"
            out.append(
                f"  losing {line}: reserve {j['reserve']} for peak {j['peak']} (ratio {ratio})"
            )
    for firing in report["firing"]:
        out.append(f"FIRING: {firing['model']} cannot absorb losing {firing['line']}")
    return "\n".join(out)
