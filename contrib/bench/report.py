"""run.py's report: the table, the goals' checks, the peers' and the ledger's lines."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence

from model import GOALS, P99_FACTOR_TARGET, SCENARIOS, Result, Scenario, Target
from servers import Servers, http_request


def throughput_ratio(prism: Result, bare: Result) -> float:
    """Prism's requests/s over the bare proxy's: the median of the rounds' ratios.

    Each round's pair ran back to back, so its ratio is the least disturbed
    by whatever else the machine was doing.
    """
    pairs = list(zip(prism.round_rps, bare.round_rps, strict=False))
    if len(pairs) == len(prism.round_rps) == len(bare.round_rps) and all(b > 0 for _, b in pairs):
        return statistics.median(p / b for p, b in pairs)
    return prism.rps / bare.rps


# --------------------------------------------------------------------------- report


def find_result(results: Sequence[Result], key: str, scenario: Scenario) -> Result | None:
    for result in results:
        if result.target.key == key and result.scenario == scenario:
            return result
    return None


def error_cell(result: Result) -> str:
    if result.failure is not None:
        return "FAILED !"
    if result.error_count == 0:
        return "0"
    parts = [f"{k}={v}" for k, v in result.errors.items() if v]
    return " ".join(parts) + " !"


def versus_bare(result: Result, bare: Result | None) -> tuple[str, str]:
    if result.target.key in ("direct", "bare") or bare is None or bare.rps <= 0:
        return "", ""
    if result.failure:
        return "", ""
    return f"{throughput_ratio(result, bare):.2f}x", f"{result.p50_ms - bare.p50_ms:+.2f}"


def format_table(results: Sequence[Result]) -> str:
    header = (
        "scenario", "target", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "errors", "vs bare",
        "Δp50 ms",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = []
    for scenario in SCENARIOS:
        bare = find_result(results, "bare", scenario)
        for result in (r for r in results if r.scenario == scenario):
            ratio, delta = versus_bare(result, bare)
            failed = result.failure is not None
            rows.append(
                (
                    scenario.label,
                    result.target.label,
                    "" if failed else f"{result.rps:.0f}",
                    "" if failed else f"{result.p50_ms:.2f}",
                    "" if failed else f"{result.p99_ms:.2f}",
                    "" if result.cpu_us is None else f"{result.cpu_us:.0f}",
                    error_cell(result),
                    ratio,
                    delta,
                )
            )
        rows.append(("",) * len(header))
    rows.pop()
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    numeric = {2, 3, 4, 5, 7, 8}

    def fmt(row: tuple[str, ...]) -> str:
        cells = (
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(row) for row in rows)])


def check_lines(results: Sequence[Result], targets: Sequence[Target]) -> list[str]:
    """PASS/FAIL of every Prism profile's goals, each over stream and non-stream."""
    lines = []
    for target in targets:
        goal = target.goal
        if goal is None:
            continue
        checks = (
            (16, "throughput", f">= {goal.ratio}x bare proxy req/s at c16"),
            (1, "latency", f"p50 <= bare +{goal.p50_delta_ms:g} ms at c1"),
            (16, "tail", f"p99 <= {P99_FACTOR_TARGET:g}x bare at c16"),
            (64, "tail", f"p99 <= {P99_FACTOR_TARGET:g}x bare at c64"),
        )
        for concurrency, kind, title in checks:
            verdicts, details = [], []
            for scenario in (s for s in SCENARIOS if s.concurrency == concurrency):
                prism = find_result(results, target.key, scenario)
                bare = find_result(results, "bare", scenario)
                name = "stream" if scenario.stream else "non-stream"
                if prism is None or bare is None or not prism.ok or not bare.ok or bare.rps <= 0:
                    verdicts.append(False)
                    details.append(f"{name}: errors in run")
                elif kind == "throughput":
                    ratio = throughput_ratio(prism, bare)
                    verdicts.append(ratio >= goal.ratio)
                    details.append(f"{name} {ratio:.2f}x")
                elif kind == "latency":
                    delta = prism.p50_ms - bare.p50_ms
                    verdicts.append(delta <= goal.p50_delta_ms)
                    details.append(f"{name} {delta:+.2f} ms")
                else:
                    factor = prism.p99_ms / bare.p99_ms if bare.p99_ms > 0 else float("inf")
                    verdicts.append(factor <= P99_FACTOR_TARGET)
                    details.append(f"{name} {factor:.2f}x")
            verdict = "PASS" if verdicts and all(verdicts) else "FAIL"
            lines.append(f"{target.label} {title}: {verdict} ({', '.join(details)})")
    return lines


def wrk_version(wrk: str) -> str:
    completed = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    first = (completed.stdout or completed.stderr).splitlines()
    return first[0].split(" [")[0] if first else "wrk ?"


def footer(args: argparse.Namespace, wrk: str, cpus: tuple[set[int], set[int]] | None) -> str:
    import aiohttp  # only for its version; the runner itself does not use it

    if cpus is None:
        placement = "everything shares the one CPU"
    else:
        placement = (
            f"servers under test on CPU {sorted(cpus[0])}, wrk and the fake upstream on "
            f"CPU {sorted(cpus[1])}"
        )
    return (
        f"{args.rounds} rounds of {args.duration} s per cell, the targets taking turns, after a "
        f"{args.warmup} s warm-up;\nreq/s is the rounds' mean, latencies and CPU their median, "
        f"'vs bare' the median of the rounds' ratios;\nwrk -t1 for c1, -t2 for c16 and c64; "
        f"{os.cpu_count()} CPUs: {placement}.\n"
        f"{wrk_version(wrk)}, Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        "servers on uvloop, one process each.\n"
        "CPU µs/req: the server's CPU time (user + system, from /proc) over the requests it\n"
        "served. 'direct' is the fake upstream itself, the ceiling for every proxy. Stream\n"
        "latency is the time to the end of the whole SSE response. '!' marks a run with errors\n"
        "(non-2xx or socket errors); its numbers are not comparable."
    )


def print_server_logs(results: Sequence[Result], probes: dict[str, str], servers: Servers) -> None:
    """Prism's output always (it is the subject); the others' only when they had errors."""
    bad = {r.target.key for r in results if not r.ok} | set(probes)
    names = {
        "direct": "fake-upstream", "bare": "bare-proxy", "prism": "prism", "full": "full",
        "fleet": "fleet-0",
    }  # fmt: skip
    for key, name in names.items():
        server = servers.started.get(name)
        if server is None or (key not in bad and key not in GOALS):
            continue
        text = server.log_path.read_text(errors="replace").splitlines()
        shown = text[-(20 if key in bad else 5) :]
        print(f"\n{server.name} stdout/stderr ({len(text)} lines, last {len(shown)}):")
        for line in shown:
            print("  " + (line if len(line) <= 160 else line[:157] + "..."))


class LedgerCommits:
    """The full profile's ledger commits per call at c16 (from its ``/prism/stats``)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.calls = self.commits = 0
        self._last = self._read()

    def _read(self) -> int:
        try:
            _, body = http_request(self.port, "GET", "/prism/stats")
            return int(json.loads(body)["counters"].get("billing_commits", 0))
        except (OSError, ValueError, KeyError):
            return 0

    def __call__(self, target: Target, scenario: Scenario, result: Result) -> None:
        now = self._read()
        if target.key == "full" and scenario.concurrency == 16:
            self.calls += result.requests
            self.commits += now - self._last
        self._last = now

    def line(self) -> str:
        per_call = self.commits / self.calls if self.calls else 0.0
        return (
            f"ledger (full profile, SQLite synchronous = full) at c16: {self.commits} commits for "
            f"{self.calls} calls, {per_call:.2f} commits per call"
        )


def peer_line(results: Sequence[Result], peer: Target) -> str:
    """Prism's ratio to a peer (req/s at c16 and c64), and every cell the peer failed."""
    parts = []
    for scenario in SCENARIOS:
        theirs = find_result(results, peer.key, scenario)
        name = scenario.label
        if theirs is None or not theirs.ok or theirs.rps <= 0:
            why = peer.broken or (theirs.failure if theirs and theirs.failure else "errors")
            parts.append(f"{name}: {peer.label} FAILED ({why[:80]})")
            continue
        for key in GOALS if scenario.concurrency > 1 else ():
            ours = find_result(results, key, scenario)
            if ours is not None and ours.ok:
                label = ours.target.label
                parts.append(f"{name} {label} {throughput_ratio(ours, theirs):.1f}x")
    return f"vs {peer.label} (req/s): " + ", ".join(parts)
