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
import dataclasses
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from proc import cpu_seconds, pin, split_cpus
from profiles import add_profile, write_full_profile

HERE = Path(__file__).resolve().parent
LUA_SCRIPT = HERE / "post.lua"
BARE_PROXY = HERE / "bare_proxy.py"
HOST = "127.0.0.1"
MODEL = "bench"
READY_TIMEOUT_S = 20.0
WRK_TIMEOUT = "10s"
#: A peer's rounds last at least this long (LiteLLM completes a handful of calls a second).
PEER_MIN_SECONDS = 10
P99_FACTOR_TARGET = 2.0  # every Prism profile: p99 at c16 <= 2 x the bare proxy's


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
class Goal:
    """What a Prism profile must reach against the bare proxy in the same run."""

    ratio: float  # req/s at c16 at least this times the bare proxy's
    p50_delta_ms: float  # p50 at c1 at most the bare proxy's plus this


#: The targets of the issue that asked for them (see README.md).
GOALS = {"prism": Goal(0.8, 0.3), "full": Goal(0.6, 1.0)}


@dataclass(frozen=True)
class Target:
    key: str  # "direct" | "bare" | "prism" | "full" | a peer's name
    label: str
    url: str
    #: The server's process (its CPU per request is measured; None: not ours to read).
    pid: int | None = None
    #: An API key wrk sends (the full profile), and other headers (peers).
    key_header: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    #: Why the target could not be measured (a peer that did not install or start).
    broken: str | None = None
    #: A slow target (LiteLLM) completes too few calls in a short round to count.
    min_seconds: int = 0

    @property
    def goal(self) -> Goal | None:
        return GOALS.get(self.key)


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
    #: The server's CPU time (user + system, its process tree) per request, in µs.
    cpu_us: float | None = None

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
    started_at: float = field(default_factory=time.monotonic)

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

    def start(
        self,
        name: str,
        argv: Sequence[str],
        cwd: Path,
        cpus: set[int] | None = None,
        env: dict[str, str] | None = None,
    ) -> Server:
        """Start ``argv`` as ``name``, in ``server_env()`` unless ``env`` is given."""
        log = self.log_dir / f"{name}.log"
        server = spawn(name, argv, cwd, log, env if env is not None else server_env(), cpus)
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


def spawn(
    name: str,
    argv: Sequence[str],
    cwd: Path,
    log_path: Path,
    env: dict[str, str],
    cpus: set[int] | None = None,
) -> Server:
    """Start a server in a session of its own (its process group is its own: Ctrl-C
    reaches only us), output to ``log_path``, on ``cpus`` if given."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            # Threads and children inherit it: the whole server stays on its CPUs.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
    return Server(name, proc, log_path)


def server_env() -> dict[str, str]:
    """The environment servers run in: no proxies, unbuffered output."""
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


def in_scratch(name: str, work: Callable[[Path], None]) -> int:
    """Run ``work`` in a scratch directory of its own; the exit status.

    SIGTERM and SIGHUP end it as SystemExit does, so the servers it started
    are stopped by their ``finally``; Ctrl-C is 130, a ``RuntimeError`` 1
    (said on stderr, prefixed with ``name``).
    """
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGHUP, _raise_on_signal)
    try:
        with tempfile.TemporaryDirectory(prefix=f"prism-{name}-") as tmp:
            work(Path(tmp))
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    return 0


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
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    timeout: float = 5.0,
    headers: Sequence[tuple[str, str]] = (),
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        sent = dict(headers)
        if body is not None:
            sent["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=sent)
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


# --------------------------------------------------------------------------- starting


def fake_upstream_argv(port: int, *extra: str) -> list[str]:
    """The fake upstream as every benchmark runs it: keeping no requests.

    A fake that keeps requests for inspection makes its collector's pauses
    long (tens of ms here), and each pause stalls every call in flight through
    the proxy under test: its p99 would measure the fake.
    """
    script = venv_script("prism-fake-upstream")
    argv = (
        [str(script)] if script is not None else [sys.executable, "-m", "prism_fake_upstream.cli"]
    )
    return [*argv, "--host", HOST, "--port", str(port), "--max-recorded", "0", *extra]


def start_upstream(servers: Servers, port: int, repo: Path, cpus: set[int] | None = None) -> Server:
    server = servers.start("fake-upstream", fake_upstream_argv(port), repo, cpus)
    wait_ready(server, port, "/s/ok/v1/models")
    return server


def start_bare_proxy(
    servers: Servers, port: int, upstream_base: str, repo: Path, cpus: set[int] | None = None
) -> Server:
    argv = [sys.executable, str(BARE_PROXY), "--port", str(port), "--upstream", upstream_base]
    return servers.start("bare-proxy", argv, repo, cpus)


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


#: A line's options beyond ``kind`` and ``base_url``, per provider kind.
LINE_OPTIONS = {
    "gemini": 'api_key_env = "BENCH_GEMINI_KEY"\n',
    "bedrock": 'region = "us-east-1"\n',
}


def line_env(kind: str) -> dict[str, str]:
    """The environment a Prism serving a line of ``kind`` needs: the fake upstream's
    credentials (Bedrock's fake checks each request's SigV4 signature with them),
    and nothing of the machine's own AWS configuration."""
    if kind == "gemini":
        return {"BENCH_GEMINI_KEY": "bench-gemini-key"}
    if kind == "bedrock":
        from prism_fake_upstream.bedrock_wire import ACCESS_KEY_ID, SECRET_ACCESS_KEY

        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    return {}


def write_prism_config(
    directory: Path,
    port: int,
    upstream_base: str,
    *,
    routing: bool = False,
    redis_url: str | None = None,
    disable: tuple[str, ...] = (),
    kind: str = "openai",
    cache: bool = False,
) -> Path:
    """A one-line Prism on ``port`` (``cache``: prism-cache's memory store on, every
    request of the model cacheable); ``kind`` is the line's provider kind (the fake
    upstream speaks each: see :data:`LINE_OPTIONS` and :func:`line_env`)."""
    if routing:
        catalog = ROUTING_CATALOG.format(base=upstream_base, model=MODEL, gate=ROUTING_GATE)
    else:
        catalog = (
            "[providers.upstream]\n"
            f'kind = "{kind}"\n'
            f'base_url = "{upstream_base}"\n' + LINE_OPTIONS.get(kind, "") + "\n"
            f"[models.{MODEL}]\n"
            f'chain = [ {{ provider = "upstream", model = "{MODEL}" }} ]\n'
            # The bench's request sets no temperature: the model says any may be kept.
             + ('cache = "all"\n' if cache else "")
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
        + ("[prism:cache]\nstore = memory\n" if cache else "")
        + (
            f"[prism:redis]\nurl = {redis_url}\nkey_prefix = prism-bench-{port}\n"
            if redis_url
            else ""
        )
    )
    return ini


def start_prism(
    servers: Servers,
    name: str,
    ini: Path,
    cpus: set[int] | None = None,
    env: dict[str, str] | None = None,
) -> Server:
    script = venv_script("prism")
    argv = [str(script)] if script is not None else [sys.executable, "-m", "prism_proxy.cli"]
    return servers.start(name, [*argv, "serve", "--config", str(ini)], ini.parent, cpus, env)


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
    before = cpu_seconds(target.pid) if target.pid is not None else None
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
    if before is not None and target.pid is not None and result.requests:
        spent = cpu_seconds(target.pid) - before
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
        f"'vs bare' the median of the rounds' ratios;\nwrk -t1 for c1, -t2 for c16; "
        f"{os.cpu_count()} CPUs: {placement}.\n"
        f"{wrk_version(wrk)}, Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        "servers on uvloop, one process each.\n"
        "CPU µs/req: the server's CPU time (user + system, from /proc) over the requests it\n"
        "served. 'direct' is the fake upstream itself, the ceiling for every proxy. Stream\n"
        "latency is the time to the end of the whole SSE response. '!' marks a run with errors\n"
        "(non-2xx or socket errors); its numbers are not comparable."
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
    add_profile(parser, "also Prism with every bundled plugin on (contrib/bench/profiles.py)")
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


def print_server_logs(results: Sequence[Result], probes: dict[str, str], servers: Servers) -> None:
    """Prism's output always (it is the subject); the others' only when they had errors."""
    bad = {r.target.key for r in results if not r.ok} | set(probes)
    names = {"direct": "fake-upstream", "bare": "bare-proxy", "prism": "prism", "full": "full"}
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
        commits = None
        if args.profile == "full":
            full_port = free_port()
            full_ini, key = write_full_profile(workdir / "full", full_port, upstream_base)
            full = start_prism(servers, "full", full_ini, under_test)
            wait_ready(full, full_port, "/readyz")
            url = f"http://{HOST}:{full_port}/v1/chat/completions"
            targets.append(Target("full", "prism full", url, full.proc.pid, key_header=key))
            commits = LedgerCommits(full_port)
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
        results = measure(
            wrk, targets, args.duration, args.warmup, args.rounds, sys.stderr, load_cpus, commits
        )
        print()
        print(format_table(results))
        print()
        for line in check_lines(results, targets):
            print(line)
        if commits is not None:
            print(commits.line())
        for other in targets:
            if other.key not in ("direct", "bare", *GOALS):
                print(peer_line(results, other))
        print()
        print(footer(args, wrk, cpus))
        print_server_logs(results, probes, servers)


def peer_line(results: Sequence[Result], peer: Target) -> str:
    """Prism's ratio to a peer (req/s, c16), or that the peer failed."""
    parts = []
    for scenario in (s for s in SCENARIOS if s.concurrency == 16):
        theirs = find_result(results, peer.key, scenario)
        name = "stream" if scenario.stream else "non-stream"
        if theirs is None or not theirs.ok or theirs.rps <= 0:
            why = peer.broken or (theirs.failure if theirs and theirs.failure else "errors")
            parts.append(f"{name}: {peer.label} FAILED ({why[:80]})")
            continue
        for key in GOALS:
            ours = find_result(results, key, scenario)
            if ours is not None and ours.ok:
                label = ours.target.label
                parts.append(f"{name} {label} {throughput_ratio(ours, theirs):.1f}x")
    return f"vs {peer.label} (req/s at c16): " + ", ".join(parts)


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
