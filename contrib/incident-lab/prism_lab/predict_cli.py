"""``prism-lab predict``'s arguments (kept apart so the study's code stays importable alone)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from .generate import TEMPLATES
from .predict import PredictOptions, format_report, predict

__all__ = ["add_predict_command", "run_predict"]


def add_predict_command(commands: Any) -> None:
    p = commands.add_parser(
        "predict",
        help="generate randomised incidents, record the gateway's signals, train and "
        "evaluate a provider-health predictor, and write its model file",
    )
    d = PredictOptions()
    p.add_argument("--out", type=Path, required=True, help="directory for the model and report")
    p.add_argument("--scenarios", type=int, default=d.scenarios, help=f"({d.scenarios})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"({d.seed})")
    p.add_argument("--horizon", type=float, default=d.horizon_s, help=f"seconds ({d.horizon_s:g})")
    p.add_argument(
        "--lookback", type=float, default=d.lookback_s, help=f"seconds ({d.lookback_s:g})"
    )
    p.add_argument(
        "--duration", type=float, default=d.duration_s, help=f"per scenario ({d.duration_s:g})"
    )
    p.add_argument("--time-scale", type=float, default=d.time_scale, help=f"({d.time_scale:g})")
    p.add_argument("--rate", type=float, default=d.rate, help=f"calls per second ({d.rate:g})")
    p.add_argument(
        "--precision-target",
        type=float,
        default=d.precision_target,
        help=f"what the threshold is chosen for ({d.precision_target:g})",
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="train again on OUT/recordings.json (recorded with the same options) instead of "
        "running the scenarios",
    )
    p.add_argument(
        "--templates",
        default="",
        help=f"cycle through these instead of drawing ({', '.join(TEMPLATES)})",
    )


def run_predict(args: argparse.Namespace) -> None:
    templates = tuple(t.strip() for t in args.templates.split(",") if t.strip())
    unknown = set(templates) - set(TEMPLATES)
    if unknown or args.scenarios < 4 or not 0.01 <= args.time_scale <= 10:
        problem = (
            f"unknown templates {sorted(unknown)} (known: {', '.join(TEMPLATES)})"
            if unknown
            else "--scenarios must be at least 4 (training, validation and held out)"
            if args.scenarios < 4
            else "--time-scale must be between 0.01 and 10"
        )
        print(f"prism-lab: predict: {problem}", file=sys.stderr)
        raise SystemExit(2)
    options = PredictOptions(
        scenarios=args.scenarios,
        seed=args.seed,
        horizon_s=args.horizon,
        lookback_s=args.lookback,
        duration_s=args.duration,
        time_scale=args.time_scale,
        rate=args.rate,
        precision_target=args.precision_target,
        templates=templates,
        reuse=args.reuse,
    )
    try:
        report = asyncio.run(
            predict(options, args.out, lambda line: print(line, file=sys.stderr, flush=True))
        )
    except (ValueError, OSError) as exc:
        # Too few of one label to train on, or recordings that do not match the options.
        print(f"prism-lab: predict: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(format_report(report))
