"""``prism-lab run SCENARIO --out DIR`` and ``prism-lab compare DIR...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from .predict_cli import add_predict_command, run_predict
from .procs import LabError
from .report import format_table, write_variant
from .runner import run_variant
from .scenario import Scenario, ScenarioError, load_scenario

__all__ = ["main", "run"]


async def run(
    scenario: Scenario, out: Path, only: Sequence[str] = (), repeat: int = 1
) -> list[dict[str, Any]]:
    """Run every variant (or those in ``only``) in turn; writes OUT/VARIANT/ and OUT/table.txt.

    Repeated runs (seed, seed + 1, ...) go to OUT/VARIANT/runK/.
    """
    summaries = []
    for k in range(repeat):
        seeded = attrs.evolve(scenario, seed=scenario.seed + k)
        for variant in scenario.variants:
            if only and variant.name not in only:
                continue
            directory = out / variant.name / (f"run{k}" if repeat > 1 else "")
            result = await run_variant(seeded, variant, directory)
            summaries.append(write_variant(seeded, result, directory))
    table = format_table(summaries)
    (out / "table.txt").write_text(table + "\n")
    return summaries


def _summaries(directories: Sequence[Path]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for directory in directories:
        paths = sorted(directory.glob("**/summary.json"))
        if not paths:
            raise LabError(f"{directory}: no summary.json in it or in its subdirectories")
        found += [json.loads(p.read_text()) for p in paths]
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prism-lab",
        description="Replay incident scenarios against real Prism gateways and measure them.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_p = commands.add_parser("run", help="run a scenario's variants and write their reports")
    run_p.add_argument("scenario", type=Path)
    run_p.add_argument("--out", type=Path, required=True, help="directory for the reports")
    run_p.add_argument("--variant", action="append", default=[], help="run only this variant")
    run_p.add_argument(
        "--repeat", type=int, default=1, help="runs per variant, seeds seed..seed+N-1 (1)"
    )
    check_p = commands.add_parser("check", help="check a scenario file and say what it runs")
    check_p.add_argument("scenario", type=Path)
    compare_p = commands.add_parser("compare", help="print the side-by-side table of runs")
    compare_p.add_argument("dirs", type=Path, nargs="+")
    add_predict_command(commands)
    args = parser.parse_args(argv)
    if args.command == "run" and args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    try:
        if args.command == "predict":
            run_predict(args)
            return
        if args.command == "compare":
            print(format_table(_summaries(args.dirs)))
            return
        scenario = load_scenario(args.scenario)
        if args.command == "check":
            names = ", ".join(v.name for v in scenario.variants)
            real = scenario.duration_s * scenario.time_scale * len(scenario.variants)
            print(f"{scenario.path}: ok: {scenario.name}, variants {names}, about {real:.0f} s")
            return
        unknown = set(args.variant) - {v.name for v in scenario.variants}
        if unknown:
            raise ScenarioError(scenario.path, "variants", f"no variant {sorted(unknown)}")
        summaries = asyncio.run(run(scenario, args.out, args.variant, args.repeat))
        print(format_table(summaries))
    except (ScenarioError, LabError) as exc:
        print(f"prism-lab: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
