"""Prism overhead benchmark: direct upstream vs a bare aiohttp proxy vs Prism.

One run starts three local servers -- the fake upstream, a bare aiohttp
pass-through proxy (``bare_proxy.py``) and ``prism serve`` pointed at that
same upstream -- and drives each with wrk: non-streaming and streaming chat
at concurrency 1 and 16.  Each cell is measured in several short rounds, the
targets taking turns within a round, so a slow spell on a shared machine
hits all of them alike.  It prints requests/s, p50/p99 latency and Prism's
ratio to the bare proxy (the median of the per-round ratios), then checks
the targets.

    python contrib/bench/run.py [--duration 2] [--rounds 3] [--quick] [--install]

Only 127.0.0.1 is ever contacted.  See contrib/bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

HERE = Path(__file__).resolve().parent
LUA_SCRIPT = HERE / "post.lua"
BARE_PROXY = HERE / "bare_proxy.py"
HOST = "127.0.0.1"
MODEL = "bench"
READY_TIMEOUT_S = 20.0
WRK_TIMEOUT = "10s"
THROUGHPUT_TARGET = 0.6  # Prism req/s >= 0.6 x bare proxy at c16
P50_DELTA_TARGET_MS = 1.0  # Prism p50 <= bare p50 + 1 ms at c1


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Scenario:
    stream: bool
    concurrency: int

    @property
    def label(self) -> str:
        return f"{'stream' if self.stream else 'non-stream'} c{self.concurrency}"

    @property
    def wrk_threads(self) -> int:
        return 1 if self.concurrency == 1 else 2


@dataclass(frozen=True)
class Target:
    key: str  # "direct" | "bare" | "prism"
    label: str
    url: str


@dataclass(frozen=True)
class Result:
    target: Target
    scenario: Scenario
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    failure: str | None = None  # wrk did not run or printed no result
    #: Requests/s of each round, in order (one entry for a single wrk run).
    round_rps: tuple[float, ...] = ()

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def ok(self) -> bool:
        return self.failure is None and self.error_count == 0 and self.requests > 0


SCENARIOS = (
    Scenario(stream=False, concurrency=1),
    Scenario(stream=False, concurrency=16),
    Scenario(stream=True, concurrency=1),
    Scenario(stream=True, concurrency=16),
)


# --------------------------------------------------------------------------- processes


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Servers:
    """Every server subprocess we start; ``stop_all`` terminates them (then kills)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: dict[str, Server] = {}

    def start(self, name: str, argv: Sequence[str], cwd: Path) -> Server:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_server_env(),
                # Own session: Ctrl-C reaches only us, and we stop them in order.
                start_new_session=True,
            )
        server = Server(name, proc, log_path)
        self.started[name] = server
        return server

    def stop_all(self) -> None:
        for server in self.started.values():
            if server.proc.poll() is None:
                server.proc.terminate()
        deadline = time.monotonic() + 5.0
        for server in self.started.values():
            try:
                server.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(var, None)
    env["NO_PROXY"] = env["no_proxy"] = "*"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextlib.contextmanager
def running_servers(log_dir: Path) -> Iterator[Servers]:
    servers = Servers(log_dir)
    try:
        yield servers
    finally:
        servers.stop_all()


def _raise_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def installed_plugin_names() -> list[str]:
    """The prism_proxy entry points installed here (what a configuration may disable)."""
    import importlib.metadata

    return sorted({ep.name for ep in importlib.metadata.entry_points(group="prism_proxy")})


def venv_script(name: str) -> Path | None:
    """A console script next to this interpreter (not resolved: venvs symlink python)."""
    candidate = Path(sys.executable).parent / name
    return candidate if candidate.exists() else None


# --------------------------------------------------------------------------- HTTP


def http_request(
    port: int, method: str, path: str, body: bytes | None = None, timeout: float = 5.0
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_ready(server: Server, port: int, path: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with code {server.proc.returncode} before it was ready:\n"
                f"{server.log_tail()}"
            )
        try:
            status, _ = http_request(port, "GET", path, timeout=1.0)
        except OSError as exc:
            last = str(exc)
        else:
            if status == 200:
                return
            last = f"HTTP {status}"
        time.sleep(0.05)
    raise RuntimeError(
        f"{server.name} not ready on {HOST}:{port}{path} after {timeout_s:.0f} s "
        f"({last}):\n{server.log_tail()}"
    )


def chat_body(stream: bool) -> bytes:
    payload: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello in ten words."}],
    }
    if stream:
        payload["stream"] = True
    return json.dumps(payload).encode()


def probe(target: Target) -> str | None:
    """One request of each kind before measuring; a problem description, or None."""
    port = int(target.url.split(":")[2].split("/")[0])
    path = "/" + target.url.split("/", 3)[3]
    problems = []
    for stream in (False, True):
        kind = "stream" if stream else "non-stream"
        try:
            status, body = http_request(port, "POST", path, chat_body(stream))
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


# --------------------------------------------------------------------------- starting


def start_upstream(servers: Servers, port: int, repo: Path) -> None:
    script = venv_script("prism-fake-upstream")
    argv = (
        [str(script)] if script is not None else [sys.executable, "-m", "prism_fake_upstream.cli"]
    )
    server = servers.start("fake-upstream", [*argv, "--host", HOST, "--port", str(port)], repo)
    wait_ready(server, port, "/s/ok/v1/models")


def start_bare_proxy(servers: Servers, port: int, upstream_base: str, repo: Path) -> Server:
    argv = [sys.executable, str(BARE_PROXY), "--port", str(port), "--upstream", upstream_base]
    return servers.start("bare-proxy", argv, repo)


#: The route-selection features on (``cpu_per_request.py --routing``): both lines in one
#: region that org-less callers are restricted to, gated by capabilities and context,
#: and ordered as one scoring group.
ROUTING_CATALOG = """\
[providers.upstream]
kind = "openai"
base_url = "{base}"
region = "eu-west-1"

[providers.twin]
kind = "openai"
base_url = "{base}"
region = "eu-west-1"

[models.{model}]
chain = [
  {{ provider = "upstream", model = "{model}", group = "g", {gate} }},
  {{ provider = "twin", model = "{model}", group = "g", {gate} }},
]
"""
ROUTING_GATE = 'capabilities = ["tools", "vision"], max_context_tokens = 100000'


def add_without(parser: argparse.ArgumentParser) -> None:
    """``--without PLUGIN``: also measure Prism with that plugin disabled (what it costs)."""
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="PLUGIN",
        help="also measure Prism with this plugin disabled: what it costs",
    )


def write_prism_config(
    directory: Path,
    port: int,
    upstream_base: str,
    *,
    routing: bool = False,
    redis_url: str | None = None,
    disable: tuple[str, ...] = (),
) -> Path:
    if routing:
        catalog = ROUTING_CATALOG.format(base=upstream_base, model=MODEL, gate=ROUTING_GATE)
    else:
        catalog = (
            "[providers.upstream]\n"
            'kind = "openai"\n'
            f'base_url = "{upstream_base}"\n'
            "\n"
            f"[models.{MODEL}]\n"
            f'chain = [ {{ provider = "upstream", model = "{MODEL}" }} ]\n'
        )
    (directory / "catalog.toml").write_text(catalog)
    ini = directory / "prism.ini"
    ini.write_text(
        "[prism]\n"
        f"listen = {HOST}:{port}\n"
        "catalog = catalog.toml\n"
        "log_level = WARNING\n"
        # Nothing is in flight when we stop it; don't wait the default 30 s.
        "shutdown_grace_s = 1\n"
        + (f"disable = {', '.join(disable)}\n" if disable else "")
        + ("[prism:regions]\ndefault = eu-west-1\n" if routing else "")
        + (
            f"[prism:redis]\nurl = {redis_url}\nkey_prefix = prism-bench-{port}\n"
            if redis_url
            else ""
        )
    )
    return ini


def start_prism(servers: Servers, port: int, upstream_base: str, workdir: Path) -> Server:
    ini = write_prism_config(workdir, port, upstream_base)
    script = venv_script("prism")
    argv = [str(script)] if script is not None else [sys.executable, "-m", "prism_proxy.cli"]
    return servers.start("prism", [*argv, "serve", "--config", str(ini)], workdir)


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
        "-s",
        str(LUA_SCRIPT),
        target.url,
    ]


def run_wrk(wrk: str, target: Target, scenario: Scenario, seconds: int) -> Result:
    env = _server_env()
    env["BENCH_STREAM"] = "1" if scenario.stream else "0"
    env["BENCH_MODEL"] = MODEL
    completed = subprocess.run(
        wrk_argv(wrk, target, scenario, seconds),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    return parse_wrk(target, scenario, completed)


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
) -> list[Result]:
    """Every scenario, ``rounds`` times over, the targets taking turns within each round.

    The turn order alternates from round to round, so neither target always
    runs right after the other.
    """
    results = []
    for scenario in SCENARIOS:
        print(f"  {scenario.label:<14}", end="", file=log, flush=True)
        if warmup > 0:
            for target in targets:
                run_wrk(wrk, target, scenario, warmup)
        runs: dict[str, list[Result]] = {t.key: [] for t in targets}
        for round_ in range(rounds):
            for target in targets if round_ % 2 == 0 else reversed(targets):
                runs[target.key].append(run_wrk(wrk, target, scenario, duration))
        for target in targets:
            result = combine(target, scenario, runs[target.key])
            summary = (
                result.failure
                if result.failure
                else f"{result.rps:.0f} req/s"
                + ("" if result.ok else f" errors: {error_cell(result)}")
            )
            print(f"  {target.label}: {summary}", end="", file=log, flush=True)
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
    return Result(
        target=target,
        scenario=scenario,
        rps=statistics.fmean(run.rps for run in runs),
        p50_ms=statistics.median(run.p50_ms for run in runs),
        p99_ms=statistics.median(run.p99_ms for run in runs),
        requests=sum(run.requests for run in runs),
        errors=errors,
        round_rps=tuple(run.rps for run in runs),
    )


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
    if result.target.key != "prism" or bare is None or bare.rps <= 0 or result.failure:
        return "", ""
    return f"{throughput_ratio(result, bare):.2f}x", f"{result.p50_ms - bare.p50_ms:+.2f}"


def format_table(results: Sequence[Result]) -> str:
    header = ("scenario", "target", "req/s", "p50 ms", "p99 ms", "errors", "vs bare", "Δp50 ms")
    rows: list[tuple[str, ...]] = []
    for scenario in SCENARIOS:
        bare = find_result(results, "bare", scenario)
        for result in (r for r in results if r.scenario == scenario):
            ratio, delta = versus_bare(result, bare)
            rows.append(
                (
                    scenario.label,
                    result.target.label,
                    f"{result.rps:.0f}",
                    f"{result.p50_ms:.2f}",
                    f"{result.p99_ms:.2f}",
                    error_cell(result),
                    ratio,
                    delta,
                )
            )
        rows.append(("",) * len(header))
    rows.pop()
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    numeric = {2, 3, 4, 6, 7}

    def fmt(row: tuple[str, ...]) -> str:
        cells = (
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(row) for row in rows)])


def check_line(results: Sequence[Result], concurrency: int, kind: str) -> str:
    """PASS/FAIL for one target over both (stream and non-stream) scenarios."""
    verdicts = []
    details = []
    for scenario in (s for s in SCENARIOS if s.concurrency == concurrency):
        prism = find_result(results, "prism", scenario)
        bare = find_result(results, "bare", scenario)
        name = "stream" if scenario.stream else "non-stream"
        if prism is None or bare is None or not prism.ok or not bare.ok or bare.rps <= 0:
            verdicts.append(False)
            details.append(f"{name}: errors in run")
            continue
        if kind == "throughput":
            ratio = throughput_ratio(prism, bare)
            verdicts.append(ratio >= THROUGHPUT_TARGET)
            details.append(f"{name} {ratio:.2f}x")
        else:
            delta = prism.p50_ms - bare.p50_ms
            verdicts.append(delta <= P50_DELTA_TARGET_MS)
            details.append(f"{name} {delta:+.2f} ms")
    verdict = "PASS" if verdicts and all(verdicts) else "FAIL"
    if kind == "throughput":
        title = f"Prism >= {THROUGHPUT_TARGET}x bare proxy throughput at c{concurrency}"
    else:
        title = f"Prism p50 <= bare +{P50_DELTA_TARGET_MS:g} ms at c{concurrency}"
    return f"{title}: {verdict} ({', '.join(details)})"


def wrk_version(wrk: str) -> str:
    completed = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    first = (completed.stdout or completed.stderr).splitlines()
    return first[0].split(" [")[0] if first else "wrk ?"


def footer(args: argparse.Namespace, wrk: str) -> str:
    import aiohttp  # only for its version; the runner itself does not use it

    return (
        f"{args.rounds} rounds of {args.duration} s per cell, the targets taking turns, after a "
        f"{args.warmup} s warm-up;\nreq/s is the rounds' mean, latencies their median, 'vs bare' "
        f"the median of the rounds' ratios;\nwrk -t1 for c1, -t2 for c16; {os.cpu_count()} CPUs.\n"
        f"{wrk_version(wrk)}, Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        "servers on uvloop, one process each.\n"
        "Caveats: wrk, the fake upstream and the proxy under test share the same CPUs, so every\n"
        "number includes CPU contention with the load generator; 'direct' is bounded by the\n"
        "fake upstream itself and is the ceiling for the two proxies. Stream latency is the\n"
        "time to the end of the whole SSE response. '!' marks a run with errors (non-2xx or\n"
        "socket errors); its numbers are not comparable."
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
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 2, 1
    if args.duration < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--duration and --rounds must be >= 1, --warmup >= 0")
    return args


def print_server_logs(results: Sequence[Result], probes: dict[str, str], servers: Servers) -> None:
    """Prism's output always (it is the subject); the others' only when they had errors."""
    bad = {r.target.key for r in results if not r.ok} | set(probes)
    names = {"direct": "fake-upstream", "bare": "bare-proxy", "prism": "prism"}
    for key in ("direct", "bare", "prism"):
        server = servers.started.get(names[key])
        if server is None or (key not in bad and key != "prism"):
            continue
        text = server.log_path.read_text(errors="replace").splitlines()
        shown = text[-(20 if key in bad else 5) :]
        print(f"\n{server.name} stdout/stderr ({len(text)} lines, last {len(shown)}):")
        for line in shown:
            print("  " + (line if len(line) <= 160 else line[:157] + "..."))


def benchmark(args: argparse.Namespace, wrk: str, repo: Path, workdir: Path) -> None:
    upstream_port, bare_port, prism_port = free_port(), free_port(), free_port()
    upstream_base = f"http://{HOST}:{upstream_port}/s/{args.scenario}/v1"
    targets = (
        Target("direct", "direct", f"{upstream_base}/chat/completions"),
        Target("bare", "bare proxy", f"http://{HOST}:{bare_port}/v1/chat/completions"),
        Target("prism", "prism", f"http://{HOST}:{prism_port}/v1/chat/completions"),
    )
    with running_servers(workdir) as servers:
        start_upstream(servers, upstream_port, repo)
        bare = start_bare_proxy(servers, bare_port, upstream_base, repo)
        prism = start_prism(servers, prism_port, upstream_base, workdir)
        wait_ready(bare, bare_port, "/healthz")
        wait_ready(prism, prism_port, "/readyz")
        probes = {t.key: p for t in targets if (p := probe(t)) is not None}
        for key, problem in probes.items():
            print(f"probe {key}: {problem}", file=sys.stderr)
        cells = len(SCENARIOS) * len(targets)
        print(f"measuring ({cells} cells, {args.rounds} rounds each):", file=sys.stderr)
        results = measure(wrk, targets, args.duration, args.warmup, args.rounds, sys.stderr)
        print()
        print(format_table(results))
        print()
        print(check_line(results, 16, "throughput"))
        print(check_line(results, 1, "latency"))
        print()
        print(footer(args, wrk))
        print_server_logs(results, probes, servers)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wrk = find_wrk(args.install)
    if wrk is None:
        message = "wrk not found: apt-get install wrk (Debian) — or run with --install"
        print(message, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGHUP, _raise_on_signal)
    repo = HERE.parent.parent
    try:
        with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
            benchmark(args, wrk, repo, Path(tmp))
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
