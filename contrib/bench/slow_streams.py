"""10,000 slow streams through one process: the bare aiohttp proxy and Prism.

Each stream is a streaming chat completion whose upstream (the fake, scenario
``trickle``) sends one token every ``--interval`` seconds for ``--duration``
seconds, so all the streams are open at once and each proxy holds a client
connection and an upstream connection per stream.  The same load runs against
the bare proxy (``bare_proxy.py``), then against ``prism serve`` with its
default plugins, each a single process.  Per target it reports the streams
completed (every token, then ``data: [DONE]``), the failures and why, the
process's CPU time (user + system, from /proc) over the run and per stream,
and its peak resident memory (VmHWM); then PASS or FAIL for

- every stream completed,
- peak RSS under 600 MB,
- Prism's CPU per stream within 1.2x the bare proxy's.

The load comes from ``--clients`` processes of this same script (aiohttp,
uvloop, no connection limit), which open the streams at an even pace over
``--ramp`` seconds, at a steady pace rather than all at once.  Linux only.

    python contrib/bench/slow_streams.py [--streams 10000] [--interval 0.5] [--duration 30]
        [--target bare|prism|both] [--clients 2] [--ramp 20]

A proxy needs two open files per stream (the caller's socket and the
upstream's), so the open-file limit bounds the streams a process can carry:
the script raises the soft limit to the hard one, and says so when the hard
limit is too low.  Only 127.0.0.1 is ever contacted.  See contrib/bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from proc import cpu_seconds
from run import (
    HOST,
    MODEL,
    Server,
    Servers,
    fake_upstream_argv,
    free_port,
    in_scratch,
    running_servers,
    start_bare_proxy,
    start_prism,
    wait_ready,
    write_prism_config,
)

HERE = Path(__file__).resolve().parent
RSS_TARGET_MB = 600.0
CPU_RATIO_TARGET = 1.2
#: Open files a proxy process holds besides its streams' sockets (stdio, the
#: listener, the event loop's own descriptors): 14 for the bare proxy and 17 for
#: ``prism serve`` with the default plugins, as measured.
BASE_FILES = 20
#: Seconds the clients wait for the last stream beyond its expected end.
MIN_SLACK_S = 20.0
#: The fake's listen queue (the kernel caps it at net.core.somaxconn).
FAKE_BACKLOG = 4096
LABELS = {"direct": "direct (fake)", "bare": "bare proxy", "prism": "prism"}


# --------------------------------------------------------------------------- limits


def raise_open_files(wanted: int) -> tuple[int, int, str | None]:
    """Soft open-file limit up to the hard one (children inherit it).

    When the hard limit is below ``wanted`` it tries to raise that too, which
    needs CAP_SYS_RESOURCE; returns the limits in force and why the hard one
    could not be raised, if it could not.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    why: str | None = None
    with contextlib.suppress(OSError, ValueError):
        wanted = min(wanted, int(Path("/proc/sys/fs/nr_open").read_text()))
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        except (ValueError, OSError) as exc:
            why = f"{exc} (CAP_SYS_RESOURCE is needed to raise it)"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard, why


# --------------------------------------------------------------------------- client


@dataclass
class ClientReport:
    """What one load-generating process saw (sent to the driver as one JSON line)."""

    completed: int = 0
    tokens: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    #: Seconds from a stream's start to its first token, per completed stream.
    first_token_s: list[float] = field(default_factory=list)
    #: The longest pause between two events of a stream, per completed stream.
    max_gap_s: list[float] = field(default_factory=list)
    #: When each stream that got its answer's headers got them, and when it closed
    #: (seconds after the start): how many were open at once.
    opened: list[float] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)
    #: Seconds after the start when the last stream ended (or the deadline came).
    ended: float = 0.0
    cpu_s: float = 0.0

    def fail(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> ClientReport:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:80]}" if text else type(exc).__name__


async def _one_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    start_at: float,
    opens_at: float,
    expected_tokens: int,
    report: ClientReport,
) -> None:
    """One stream, opened at ``opens_at`` (epoch): read to ``data: [DONE]``, count tokens."""
    loop = asyncio.get_running_loop()
    delay = opens_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    began = loop.time()
    tokens = 0
    done = False
    first: float | None = None
    last = began
    max_gap = 0.0
    headers_at: float | None = None
    try:
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                text = (await resp.read())[:60].decode(errors="replace")
                report.fail(f"HTTP {resp.status} {text}")
                return
            headers_at = time.time() - start_at
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                now = loop.time()
                max_gap = max(max_gap, now - last)
                last = now
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                event = orjson.loads(payload)
                for choice in event.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        tokens += 1
                        if first is None:
                            first = now - began
    except Exception as exc:  # aiohttp.ClientError, OSError, a bad event: counted, go on
        report.fail(_short(exc))
        return
    finally:
        report.tokens += tokens
        if headers_at is not None:
            report.opened.append(round(headers_at, 3))
            report.closed.append(round(time.time() - start_at, 3))
    if not done:
        report.fail("ended without [DONE]")
    elif tokens != expected_tokens:
        report.fail(f"[DONE] after {tokens} of {expected_tokens} tokens")
    else:
        report.completed += 1
        report.first_token_s.append(first if first is not None else 0.0)
        report.max_gap_s.append(max_gap)


async def client_main(args: argparse.Namespace) -> None:
    """One load-generating process: say ready, read the start time, run its share."""
    url = f"http://{HOST}:{args.port}{args.path}"
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "stream": True,
        }
    ).encode()
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    report = ClientReport()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        start_at = float(line)
        # This process's share: streams index, index + clients, ... of the whole ramp.
        spacing = args.ramp / max(args.total, 1)
        tasks = [
            asyncio.ensure_future(
                _one_stream(
                    session, url, body, start_at, start_at + i * spacing, args.tokens, report
                )
            )
            for i in range(args.index, args.total, args.clients)
        ]
        deadline = start_at + args.ramp + args.tokens * args.interval + args.slack
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.time()))
        report.ended = time.time() - start_at
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            report.failures["unfinished at the deadline"] = len(pending)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report.cpu_s = usage.ru_utime + usage.ru_stime
    print(report.to_json(), flush=True)


# --------------------------------------------------------------------------- measuring


@dataclass
class TargetResult:
    key: str
    streams: int
    completed: int = 0
    tokens: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    peak_files: int = 0
    upstream_cpu_s: float = 0.0
    clients_cpu_s: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    max_gap_s: list[float] = field(default_factory=list)
    opened: list[float] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)
    #: Connections the kernel dropped on a full accept queue meanwhile (any socket's).
    listen_overflows: int = 0
    error: str | None = None

    @property
    def label(self) -> str:
        return LABELS[self.key]

    @property
    def cpu_per_stream_us(self) -> float:
        return self.cpu_s / max(self.streams, 1) * 1e6

    @property
    def all_complete(self) -> bool:
        return self.error is None and self.completed == self.streams

    @property
    def peak_open(self) -> int:
        """The most streams open at once (headers received, not yet closed)."""
        steps = sorted([(t, 1) for t in self.opened] + [(t, -1) for t in self.closed])
        running = peak = 0
        for _, step in steps:
            running += step
            peak = max(peak, running)
        return peak


def _status_field(pid: int, name: str) -> int:
    """A ``kB`` field of /proc/PID/status (VmHWM, VmRSS), 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def listen_overflows() -> int:
    """The kernel's count of connections dropped on a full accept queue (all sockets)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table.get("ListenOverflows", 0))
    return 0


def _open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def _watch(pid: int, result: TargetResult, stop: asyncio.Event) -> None:
    """Sample the server's open files (and keep its VmHWM) until ``stop``."""
    while not stop.is_set():
        result.peak_files = max(result.peak_files, _open_files(pid))
        result.peak_rss_mb = max(result.peak_rss_mb, _status_field(pid, "VmHWM") / 1024)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def _start_client(
    args: argparse.Namespace, index: int, port: int, path: str
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--client",
        "--port",
        str(port),
        "--path",
        path,
        "--index",
        str(index),
        "--clients",
        str(args.clients),
        "--total",
        str(args.streams),
        "--tokens",
        str(args.tokens),
        "--interval",
        str(args.interval),
        "--ramp",
        str(args.ramp),
        "--slack",
        str(args.slack),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
    )


async def drive(
    args: argparse.Namespace, key: str, server_pid: int, port: int, path: str, upstream_pid: int
) -> TargetResult:
    """Run the whole load against one target and measure its process."""
    result = TargetResult(key, args.streams)
    clients = [await _start_client(args, i, port, path) for i in range(args.clients)]
    for client in clients:
        assert client.stdout is not None
        ready = await asyncio.wait_for(client.stdout.readline(), 60)
        if ready.strip() != b"ready":
            raise RuntimeError(f"a load client did not start: {ready!r}")
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(_watch(server_pid, result, stop))
    cpu_before = cpu_seconds(server_pid)
    upstream_before = cpu_seconds(upstream_pid)
    overflows_before = listen_overflows()
    start_at = time.time() + 0.5
    for client in clients:
        assert client.stdin is not None
        client.stdin.write(f"{start_at!r}\n".encode())
        await client.stdin.drain()
        client.stdin.close()
    ended = 0.0
    try:
        for client in clients:
            out, _ = await client.communicate()
            lines = out.decode().strip().splitlines()
            if client.returncode != 0 or not lines:
                raise RuntimeError(f"a load client failed (exit {client.returncode})")
            report = ClientReport.from_json(lines[-1])
            result.completed += report.completed
            result.tokens += report.tokens
            result.failures.update(report.failures)
            result.first_token_s += report.first_token_s
            result.max_gap_s += report.max_gap_s
            result.opened += report.opened
            result.closed += report.closed
            result.clients_cpu_s += report.cpu_s
            ended = max(ended, report.ended)
    finally:
        for client in clients:
            if client.returncode is None:
                client.kill()
                await client.wait()
    result.cpu_s = cpu_seconds(server_pid) - cpu_before
    result.upstream_cpu_s = cpu_seconds(upstream_pid) - upstream_before
    result.wall_s = ended
    result.listen_overflows = listen_overflows() - overflows_before
    stop.set()
    await watcher
    result.peak_rss_mb = max(result.peak_rss_mb, _status_field(server_pid, "VmHWM") / 1024)
    return result


def prism_config(directory: Path, port: int, upstream_base: str, pool: int) -> Path:
    """``write_prism_config``'s configuration, the provider's pool opened to ``pool``.

    The openai provider pools at most 256 upstream connections by default
    (the provider option ``max_connections``); calls beyond it queue for a
    connection, so 10,000 concurrent streams need the pool opened up.
    """
    ini = write_prism_config(directory, port, upstream_base)
    if pool > 0:
        catalog = directory / "catalog.toml"
        text = catalog.read_text()
        anchor = 'kind = "openai"\n'
        if anchor not in text:
            raise RuntimeError("write_prism_config's catalog changed: no openai provider line")
        catalog.write_text(text.replace(anchor, anchor + f"max_connections = {pool}\n", 1))
    return ini


def start_target(
    key: str, servers: Servers, args: argparse.Namespace, upstream_base: str, workdir: Path
) -> tuple[Server, int, str]:
    repo = HERE.parent.parent
    port = free_port()
    if key == "bare":
        server = start_bare_proxy(servers, port, upstream_base, repo)
        wait_ready(server, port, "/healthz")
        return server, port, "/v1/chat/completions"
    if key == "prism":
        here = workdir / "prism"
        here.mkdir()
        pool = args.streams + 64 if args.provider_connections is None else args.provider_connections
        ini = prism_config(here, port, upstream_base, pool)
        server = start_prism(servers, "prism", ini)
        wait_ready(server, port, "/readyz")
        return server, port, "/v1/chat/completions"
    raise ValueError(key)


def start_fake(servers: Servers, port: int, repo: Path) -> Server:
    """The fake upstream, its listen queue raised: a proxy opens thousands of connections."""
    argv = fake_upstream_argv(port, "--backlog", str(FAKE_BACKLOG))
    server = servers.start("fake-upstream", argv, repo)
    wait_ready(server, port, "/s/ok/v1/models")
    return server


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


# --------------------------------------------------------------------------- report


def _percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def format_table(results: Sequence[TargetResult]) -> str:
    header = (
        "target",
        "completed",
        "failed",
        "tokens",
        "wall s",
        "CPU s",
        "CPU/stream us",
        "peak RSS MB",
        "peak fds",
        "peak open",
        "last open s",
        "TTFT p50/p99 ms",
        "gap p99 ms",
        "fake CPU s",
        "clients CPU s",
    )
    rows = [header]
    for r in results:
        rows.append(
            (
                r.label,
                f"{r.completed}/{r.streams}",
                str(sum(r.failures.values())),
                str(r.tokens),
                f"{r.wall_s:.1f}",
                f"{r.cpu_s:.2f}",
                f"{r.cpu_per_stream_us:.0f}",
                f"{r.peak_rss_mb:.0f}",
                str(r.peak_files),
                str(r.peak_open),
                f"{max(r.opened):.1f}" if r.opened else "-",
                f"{_percentile(r.first_token_s, 0.5) * 1e3:.0f}/"
                f"{_percentile(r.first_token_s, 0.99) * 1e3:.0f}",
                f"{_percentile(r.max_gap_s, 0.99) * 1e3:.0f}",
                f"{r.upstream_cpu_s:.2f}",
                f"{r.clients_cpu_s:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def checks(results: Sequence[TargetResult]) -> list[str]:
    out = []
    for r in results:
        if r.key == "direct":
            continue
        verdict = "PASS" if r.all_complete else "FAIL"
        out.append(
            f"{r.label}: all {r.streams} streams complete: {verdict} ({r.completed}/{r.streams}, "
            f"at most {r.peak_open} open at once)"
        )
        verdict = "PASS" if r.error is None and 0 < r.peak_rss_mb < RSS_TARGET_MB else "FAIL"
        out.append(
            f"{r.label}: peak RSS < {RSS_TARGET_MB:.0f} MB: {verdict} ({r.peak_rss_mb:.0f} MB)"
        )
    by_key = {r.key: r for r in results}
    bare, prism = by_key.get("bare"), by_key.get("prism")
    if bare is not None and prism is not None:
        if bare.error is None and prism.error is None and bare.cpu_per_stream_us > 0:
            ratio = prism.cpu_per_stream_us / bare.cpu_per_stream_us
            verdict = "PASS" if ratio <= CPU_RATIO_TARGET else "FAIL"
            comparable = "" if bare.all_complete and prism.all_complete else ", not all complete"
            out.append(
                f"Prism CPU per stream <= {CPU_RATIO_TARGET}x bare proxy: {verdict} "
                f"({ratio:.2f}x: {prism.cpu_per_stream_us:.0f} us vs "
                f"{bare.cpu_per_stream_us:.0f} us{comparable})"
            )
        else:
            out.append(f"Prism CPU per stream <= {CPU_RATIO_TARGET}x bare proxy: FAIL (no run)")
    return out


def failure_lines(results: Sequence[TargetResult]) -> list[str]:
    out = []
    for r in results:
        if r.error is not None:
            out.append(f"{r.label}: {r.error}")
        if r.listen_overflows:
            out.append(
                f"{r.label}: {r.listen_overflows} connections dropped on a full accept queue "
                "(TcpExt ListenOverflows, machine-wide), retried by the client's TCP"
            )
        for reason, count in r.failures.most_common(8):
            out.append(f"{r.label}: {count} x {reason}")
        if len(r.failures) > 8:
            out.append(f"{r.label}: ... {len(r.failures) - 8} other reasons")
    return out


# --------------------------------------------------------------------------- main


async def benchmark(args: argparse.Namespace, workdir: Path) -> list[TargetResult]:
    repo = HERE.parent.parent
    keys = {"both": ["bare", "prism"]}.get(args.target, [args.target])
    results: list[TargetResult] = []
    with running_servers(workdir) as servers:
        upstream_port = free_port()
        fake = start_fake(servers, upstream_port, repo)
        upstream_pid = fake.proc.pid
        ms = round(args.interval * 1000)
        upstream_base = f"http://{HOST}:{upstream_port}/s/trickle{args.tokens}x{ms}/v1"
        print(f"upstream: {upstream_base}", file=sys.stderr)
        for key in keys:
            server: Server | None = None
            if key == "direct":
                pid, port = upstream_pid, upstream_port
                path = upstream_base.split(str(upstream_port), 1)[1] + "/chat/completions"
            else:
                server, port, path = start_target(key, servers, args, upstream_base, workdir)
                pid = server.proc.pid
            print(f"{LABELS[key]}: {args.streams} streams ...", file=sys.stderr, flush=True)
            try:
                result = await drive(args, key, pid, port, path, upstream_pid)
            except RuntimeError as exc:
                result = TargetResult(key, args.streams, error=str(exc))
            results.append(result)
            print(
                f"{LABELS[key]}: {result.completed}/{result.streams} complete, "
                f"{result.cpu_per_stream_us:.0f} us CPU a stream, "
                f"peak RSS {result.peak_rss_mb:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
            if server is not None:
                stop(server)
                if result.failures or result.error:
                    print(f"{server.name} log (last 10 lines):\n{server.log_tail(10)}")
            await asyncio.sleep(1.0)  # the fake lets go of the previous target's sockets
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--streams", type=int, default=10_000, help="concurrent streams (10000)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between tokens (0.5)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds a stream lasts (30)")
    parser.add_argument(
        "--target",
        choices=("bare", "prism", "both", "direct"),
        default="both",
        help="both: the bare proxy, then Prism (direct: the fake upstream alone)",
    )
    parser.add_argument("--clients", type=int, default=2, help="load processes (2)")
    parser.add_argument(
        "--ramp", type=float, default=20.0, help="seconds over which the streams open (20)"
    )
    parser.add_argument(
        "--provider-connections",
        type=int,
        default=None,
        metavar="N",
        help="Prism's upstream pool (the provider option max_connections); "
        "default: streams + 64; 0 leaves Prism's default (256)",
    )
    # The load-generating processes run this script with --client.
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--slack", type=float, default=MIN_SLACK_S, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return args
    if args.streams < 1 or args.interval <= 0 or args.duration < args.interval:
        parser.error("--streams >= 1, --interval > 0 and --duration >= --interval")
    if args.clients < 1 or args.ramp < 0:
        parser.error("--clients >= 1 and --ramp >= 0")
    args.tokens = max(1, round(args.duration / args.interval))
    args.slack = max(MIN_SLACK_S, args.duration)
    return args


def footer(args: argparse.Namespace, limits: tuple[int, int, str | None]) -> str:
    soft, hard, _ = limits
    return (
        f"{args.streams} streams of {args.tokens} tokens, one every {args.interval:g} s, "
        f"opened over {args.ramp:g} s by {args.clients} client processes;\n"
        "CPU is the server process's user + system time from the first stream's start to the\n"
        "last one's end, per stream started; peak RSS its VmHWM; TTFT the time to the first\n"
        "token, gap the longest pause between two events of a stream (completed streams).\n"
        f"Open files: soft {soft}, hard {hard}. {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, aiohttp {aiohttp.__version__}, one process per server,\n"
        "the fake upstream, the proxy and the clients sharing the CPUs."
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A proxy holds two sockets a stream; ``prism serve`` also accepts callers up to 45% of
    # its open-file limit only (``[prism] max_connections``' default), so the servers (who
    # inherit the limit) get three a stream: 10,000 streams fit under 45% of 30,020.
    needed = 2 * args.total + BASE_FILES if args.client else 3 * args.streams + BASE_FILES
    limits = raise_open_files(needed)
    if args.client:
        uvloop.run(client_main(args))
        return 0
    soft, _, why = limits
    if soft < needed:
        print(
            f"warning: a proxy needs about {needed} open files for {args.streams} streams "
            f"(two a stream, plus its own); the limit is {soft}"
            + (f" and the hard limit cannot be raised: {why}" if why else "")
            + f". Expect failures beyond about {min((soft - BASE_FILES) // 2, soft * 45 // 100)}"
            " streams.",
            file=sys.stderr,
        )
    results: list[TargetResult] = []
    status = in_scratch(
        "slow-streams", lambda scratch: results.extend(asyncio.run(benchmark(args, scratch)))
    )
    if status:
        return status
    print()
    print(format_table(results))
    print()
    for line in failure_lines(results):
        print(line)
    for line in checks(results):
        print(line)
    print()
    print(footer(args, limits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
