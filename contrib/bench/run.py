"""Prism overhead benchmark: direct upstream vs a bare aiohttp proxy vs Prism.

One run starts three local servers -- the fake upstream, a bare aiohttp
pass-through proxy (``bare_proxy.py``) and ``prism serve`` pointed at that
same upstream -- and drives each with wrk: non-streaming and streaming chat
at concurrency 1, 16 and 64.  Each cell is measured in several short rounds, the
targets taking turns within a round, so a slow spell on a shared machine
hits all of them alike.  It prints requests/s, p50/p99 latency and Prism's
ratio to the bare proxy (the median of the per-round ratios), then checks
the targets.

    python contrib/bench/run.py [--duration 2] [--rounds 3] [--quick] [--install]
        [--profile default|full|full-classic|fleet] [--peers]

Only 127.0.0.1 is ever contacted.  See contrib/bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from model import GOALS, SCENARIOS, Goal, Result, Scenario, Target
from proc import cpu_seconds, pin, split_cpus
from profiles import add_profile, write_full_profile
from report import (
    LedgerCommits,
    check_lines,
    error_cell,
    find_result,
    footer,
    format_table,
    peer_line,
    print_server_logs,
    throughput_ratio,
)
from servers import (
    BARE_PROXY,
    HOST,
    MODEL,
    ROUTING_CATALOG,
    ROUTING_GATE,
    Server,
    Servers,
    add_without,
    fake_upstream_argv,
    free_port,
    http_request,
    in_scratch,
    installed_plugin_names,
    line_env,
    running_servers,
    server_env,
    spawn,
    start_bare_proxy,
    start_prism,
    start_upstream,
    venv_script,
    wait_ready,
    write_prism_config,
)

if TYPE_CHECKING:
    from fleet import FleetTrips

# What the other scripts of the bench import from here (they predate the split).
__all__ = [
    "BARE_PROXY", "GOALS", "HOST", "MODEL", "ROUTING_CATALOG", "ROUTING_GATE", "SCENARIOS",
    "Goal", "Result", "Scenario", "Server", "Servers", "Target", "add_without", "chat_body",
    "check_lines", "error_cell", "fake_upstream_argv", "find_result", "find_wrk", "footer",
    "format_table", "free_port", "http_request", "in_scratch", "installed_plugin_names",
    "line_env", "measure", "peer_line", "print_server_logs", "probe", "running_servers",
    "server_env", "spawn", "start_bare_proxy", "start_prism", "start_upstream",
    "throughput_ratio", "venv_script", "wait_ready", "write_prism_config",
]  # fmt: skip

HERE = Path(__file__).resolve().parent
LUA_SCRIPT = HERE / "post.lua"
WRK_TIMEOUT = "10s"
#: A peer's rounds last at least this long (LiteLLM completes a handful of calls a second).
PEER_MIN_SECONDS = 10
#: Where ``--profile fleet`` makes its database and its Redis prefix (each its own).
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def chat_body(stream: bool) -> bytes:
    payload: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello in ten words."}],
    }
    if stream:
        payload["stream"] = True
    return json.dumps(payload).encode()


def request_headers(target: Target) -> list[tuple[str, str]]:
    headers = list(target.headers)
    if target.key_header:
        headers.append(("Authorization", f"Bearer {target.key_header}"))
    return headers


def probe(target: Target) -> str | None:
    """One request of each kind before measuring; a problem description, or None."""
    if target.broken:
        return target.broken
    port = int(target.url.split(":")[2].split("/")[0])
    path = "/" + target.url.split("/", 3)[3]
    problems = []
    for stream in (False, True):
        kind = "stream" if stream else "non-stream"
        try:
            status, body = http_request(
                port, "POST", path, chat_body(stream), headers=request_headers(target)
            )
        except OSError as exc:
            problems.append(f"{kind}: {exc}")
            continue
        if status != 200:
            problems.append(f"{kind}: HTTP {status} {body[:200]!r}")
        elif stream and b"[DONE]" not in body:
            problems.append(f"{kind}: stream without [DONE]: {body[-200:]!r}")
        elif not stream and b'"choices"' not in body:
            problems.append(f"{kind}: no choices in {body[:200]!r}")
    return "; ".join(problems) or None


# --------------------------------------------------------------------------- wrk


def find_wrk(install: bool) -> str | None:
    found = shutil.which("wrk")
    if found is not None or not install:
        return found
    if os.geteuid() != 0:
        print("--install needs root (apt-get install -y wrk)", file=sys.stderr)
        return None
    print("installing wrk: apt-get update && apt-get install -y wrk", file=sys.stderr)
    subprocess.run(["apt-get", "update"], check=False)
    subprocess.run(["apt-get", "install", "-y", "wrk"], check=False)
    return shutil.which("wrk")


def wrk_argv(wrk: str, target: Target, scenario: Scenario, seconds: int) -> list[str]:
    return [
        wrk,
        f"-t{scenario.wrk_threads}",
        f"-c{scenario.concurrency}",
        f"-d{seconds}s",
        "--timeout",
        WRK_TIMEOUT,
        "--latency",
        "-s",
        str(LUA_SCRIPT),
        target.url,
    ]


def run_wrk(
    wrk: str, target: Target, scenario: Scenario, seconds: int, cpus: set[int] | None = None
) -> Result:
    if target.broken:
        return Result(target, scenario, failure=target.broken)
    env = server_env()
    env["BENCH_STREAM"] = "1" if scenario.stream else "0"
    env["BENCH_MODEL"] = MODEL
    env["BENCH_KEY"] = target.key_header or ""
    env["BENCH_HEADERS"] = "\n".join(f"{name}: {value}" for name, value in target.headers)
    # A word of this run's own: no prompt repeats one of an earlier run either.
    env["BENCH_DISTINCT"] = secrets.token_hex(6) if target.distinct else ""
    if target.more_ports:
        port = target.url.split(":")[2].split("/")[0]
        env["BENCH_PORTS"] = ",".join([port, *map(str, target.more_ports)])
    pids = [] if target.pid is None else [target.pid, *target.more_pids]
    before = sum(map(cpu_seconds, pids)) if pids else None
    seconds = max(seconds, target.min_seconds)
    completed = subprocess.run(
        wrk_argv(wrk, target, scenario, seconds),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    result = parse_wrk(target, scenario, completed)
    if before is not None and result.requests:
        spent = sum(map(cpu_seconds, pids)) - before
        result = dataclasses.replace(result, cpu_us=spent / result.requests * 1e6)
    return result


def parse_wrk(
    target: Target, scenario: Scenario, completed: subprocess.CompletedProcess[str]
) -> Result:
    for line in completed.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            data = json.loads(line.removeprefix("BENCH_JSON "))
            return Result(
                target=target,
                scenario=scenario,
                rps=float(data["rps"]),
                p50_ms=data["p50_us"] / 1000.0,
                p99_ms=data["p99_us"] / 1000.0,
                requests=int(data["requests"]),
                errors={k: int(v) for k, v in data["errors"].items()},
                round_rps=(float(data["rps"]),),
            )
    output = (completed.stderr or completed.stdout).strip()[-300:]
    return Result(target, scenario, failure=f"wrk exit {completed.returncode}: {output}")


def measure(
    wrk: str,
    targets: Sequence[Target],
    duration: int,
    warmup: int,
    rounds: int,
    log: IO[str],
    cpus: set[int] | None = None,
    on_run: Callable[[Target, Scenario, Result], None] | None = None,
) -> list[Result]:
    """Every scenario, ``rounds`` times over, the targets taking turns within each round.

    The turn order alternates from round to round, so neither target always
    runs right after the other.  wrk runs on ``cpus``; ``on_run`` sees every
    measured run (not the warm-ups).
    """
    results = []
    for scenario in SCENARIOS:
        print(f"  {scenario.label:<14}", end="", file=log, flush=True)
        if warmup > 0:
            for target in targets:
                run_wrk(wrk, target, scenario, warmup, cpus)
        runs: dict[str, list[Result]] = {t.key: [] for t in targets}
        for round_ in range(rounds):
            for target in targets if round_ % 2 == 0 else reversed(targets):
                run = run_wrk(wrk, target, scenario, duration, cpus)
                if on_run is not None:
                    on_run(target, scenario, run)
                runs[target.key].append(run)
        for target in targets:
            result = combine(target, scenario, runs[target.key])
            summary = (
                result.failure
                if result.failure
                else f"{result.rps:.0f} req/s"
                + ("" if result.ok else f" errors: {error_cell(result)}")
            )
            print(f"  {target.label}: {summary[:60]}", end="", file=log, flush=True)
            results.append(result)
        print(file=log, flush=True)
    return results


def combine(target: Target, scenario: Scenario, runs: Sequence[Result]) -> Result:
    """One cell from its rounds: mean requests/s, median latencies, every error counted."""
    failed = next((run for run in runs if run.failure), None)
    if failed is not None:
        return failed
    errors: dict[str, int] = {}
    for run in runs:
        for kind, count in run.errors.items():
            errors[kind] = errors.get(kind, 0) + count
    cpu = [run.cpu_us for run in runs if run.cpu_us is not None]
    return Result(
        target=target,
        scenario=scenario,
        rps=statistics.fmean(run.rps for run in runs),
        p50_ms=statistics.median(run.p50_ms for run in runs),
        p99_ms=statistics.median(run.p99_ms for run in runs),
        requests=sum(run.requests for run in runs),
        errors=errors,
        round_rps=tuple(run.rps for run in runs),
        cpu_us=statistics.median(cpu) if cpu else None,
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark Prism against a bare aiohttp proxy and the upstream itself."
    )
    parser.add_argument("--duration", type=int, default=2, help="seconds per round (2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per cell (3)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds per cell (1)")
    parser.add_argument("--quick", action="store_true", help="one round of 2 s per cell")
    parser.add_argument(
        "--install", action="store_true", help="apt-get install wrk if it is missing (root)"
    )
    parser.add_argument(
        "--scenario",
        default="ok",
        help="fake upstream scenario for all targets (default ok; e.g. slow, err500)",
    )
    add_profile(
        parser,
        "also Prism with every bundled plugin on (contrib/bench/profiles.py)",
        fleet="also the full profile on two gateways sharing PostgreSQL and Redis "
        "(contrib/bench/fleet.py), with their round trips per call",
    )
    parser.add_argument(
        "--postgres",
        default=LOCAL_POSTGRES,
        help=f"--profile fleet: a PostgreSQL to make the run's database in ({LOCAL_POSTGRES})",
    )
    parser.add_argument(
        "--redis", default=LOCAL_REDIS, help=f"--profile fleet: the Redis to share ({LOCAL_REDIS})"
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also Portkey's gateway and the LiteLLM proxy (installed into a scratch cache)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let every process run on any CPU (default: servers under test on one CPU)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 2, 1
    if args.duration < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--duration and --rounds must be >= 1, --warmup >= 0")
    return args


def benchmark(args: argparse.Namespace, wrk: str, repo: Path, workdir: Path) -> None:
    cpus = None if args.no_pin else split_cpus()
    under_test, load_cpus = (None, None) if cpus is None else cpus
    upstream_port, bare_port, prism_port = free_port(), free_port(), free_port()
    upstream_base = f"http://{HOST}:{upstream_port}/s/{args.scenario}/v1"
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(running_servers(workdir))
        upstream = start_upstream(servers, upstream_port, repo, load_cpus)
        bare = start_bare_proxy(servers, bare_port, upstream_base, repo, under_test)
        ini = write_prism_config(workdir, prism_port, upstream_base)
        prism = start_prism(servers, "prism", ini, under_test)
        targets = [
            Target("direct", "direct", f"{upstream_base}/chat/completions", upstream.proc.pid),
            Target("bare", "bare proxy", f"http://{HOST}:{bare_port}/v1/chat/completions",
                   bare.proc.pid),
            Target("prism", "prism", f"http://{HOST}:{prism_port}/v1/chat/completions",
                   prism.proc.pid),
        ]  # fmt: skip
        wait_ready(bare, bare_port, "/healthz")
        wait_ready(prism, prism_port, "/readyz")
        hooks: list[Callable[[Target, Scenario, Result], None]] = []
        commits = trips = None
        if args.profile in ("full", "full-classic", "fleet"):
            full_port = free_port()
            classic = args.profile == "full-classic"
            full_ini, key = write_full_profile(
                workdir / "full", full_port, upstream_base, classic=classic
            )
            full = start_prism(servers, "full", full_ini, under_test)
            wait_ready(full, full_port, "/readyz")
            url = f"http://{HOST}:{full_port}/v1/chat/completions"
            label = "prism classic" if classic else "prism full"
            targets.append(Target("full", label, url, full.proc.pid, key_header=key,
                                  distinct=not classic))  # fmt: skip
            commits = LedgerCommits(full_port)
            hooks.append(commits)
        if args.profile == "fleet":
            trips = start_fleet(args, stack, servers, workdir, upstream_base, targets, under_test)
            hooks.append(trips)
        if args.peers:
            from peers import running_peers

            print("starting peers (the first run installs them: minutes)...", file=sys.stderr)
            for peer in stack.enter_context(running_peers(upstream_base, workdir / "peers")):
                if peer.pid is not None and under_test is not None:
                    pin(peer.pid, under_test)
                headers = tuple(peer.headers.items())
                targets.append(
                    Target(
                        peer.name, peer.name, peer.url, peer.pid, None, headers, peer.failure,
                        min_seconds=PEER_MIN_SECONDS,
                    )
                )  # fmt: skip
        probes = {t.key: p for t in targets if (p := probe(t)) is not None}
        for key, problem in probes.items():
            print(f"probe {key}: {problem}", file=sys.stderr)
        cells = len(SCENARIOS) * len(targets)
        print(f"measuring ({cells} cells, {args.rounds} rounds each):", file=sys.stderr)

        def on_run(target: Target, scenario: Scenario, result: Result) -> None:
            for hook in hooks:
                hook(target, scenario, result)

        results = measure(
            wrk, targets, args.duration, args.warmup, args.rounds, sys.stderr, load_cpus, on_run
        )
        print()
        print(format_table(results))
        print()
        for line in check_lines(results, targets):
            print(line)
        if commits is not None:
            print(commits.line())
        if trips is not None:
            print("\n".join(trips.lines()))
        for other in targets:
            if other.key not in ("direct", "bare", *GOALS):
                print(peer_line(results, other))
        print()
        print(footer(args, wrk, cpus))
        print_server_logs(results, probes, servers)


def start_fleet(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    servers: Servers,
    workdir: Path,
    upstream_base: str,
    targets: list[Target],
    cpus: set[int] | None,
) -> FleetTrips:
    """Two gateways of the full profile on shared state (``fleet.py``); their counters."""
    from fleet import FleetTrips, fleet_state, write_fleet

    state = stack.enter_context(fleet_state(args.postgres, args.redis))
    # Servers stopped before the state is dropped: a gateway writes to Redis as it stops.
    stack.callback(servers.stop_all)
    ports = [free_port(), free_port()]
    inis, key = write_fleet(workdir / "fleet", ports, upstream_base, state)
    started = [start_prism(servers, f"fleet-{n}", ini, cpus) for n, ini in enumerate(inis)]
    for server, port in zip(started, ports, strict=True):
        wait_ready(server, port, "/readyz")
    url = f"http://{HOST}:{ports[0]}/v1/chat/completions"
    targets.append(
        Target("fleet", "prism fleet", url, started[0].proc.pid, key_header=key, distinct=True,
               more_ports=tuple(ports[1:]), more_pids=tuple(s.proc.pid for s in started[1:]))
    )  # fmt: skip
    return FleetTrips(ports, state, args.postgres)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wrk = find_wrk(args.install)
    if wrk is None:
        message = "wrk not found: apt-get install wrk (Debian) — or run with --install"
        print(message, file=sys.stderr)
        return 2
    repo = HERE.parent.parent
    return in_scratch("bench", lambda scratch: benchmark(args, wrk, repo, scratch))


if __name__ == "__main__":
    raise SystemExit(main())
