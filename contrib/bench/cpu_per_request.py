"""CPU time per request: the bare aiohttp proxy and Prism, under the same wrk load.

Throughput on a shared two-core machine swings from run to run with whatever
else runs; the CPU a proxy process spends per request does not.  This script
starts the fake upstream, the bare proxy and ``prism serve`` (one provider, one
model), drives each with ``wrk -t2 -c16`` for a few seconds, non-streaming and
streaming, and prints the process CPU time (user + system, from /proc) divided
by the requests served, and the calls per second wrk saw.  Linux only.
As ``run.py`` does, the servers under test run on the last CPU and wrk and the
fake upstream on the others (``--no-pin``: anywhere), and each kind of call
is measured in ``--rounds`` rounds in which the targets take turns, the order
reversed every other round: a slow spell falls on all of them alike.  A
target's CPU per request is the median of its rounds.
``--workers N`` adds ``prism serve --workers N`` (its CPU is the supervisor's
and every worker's) and, to compare it with, one process with the same
configuration; both share the breaker's state through prism-redis (``--redis``).
``--threads`` splits each one-process target's CPU per request between its
main thread (the event loop) and its other threads (the ledger's writer),
user and system time apart.  ``--profile limits`` measures the full profile
and the same with prism-limits (no limit applying; limits applying, counted
in the process; counted in the Redis of ``--redis``, beside the full profile
with prism-redis alone) and prints each against its reference.  ``--lines``
adds a Responses API call translated to chat, and a Prism whose line is on
Gemini's wire and one on Bedrock's (the fake upstream speaks both), each
against a chat call on an OpenAI line.  ``--cache`` adds Prism with
prism-cache's memory store, called so that every call is a hit, and called
with ``Cache-Control: no-cache`` (a miss, whose answer is stored), each
against ``prism`` (the cache installed, not configured).

    python contrib/bench/cpu_per_request.py [--duration 2] [--rounds 3] [--routing] [--workers 2]
                                            [--threads] [--no-pin] [--profile default|full|limits]
                                            [--lines] [--cache]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from proc import cpu_seconds, split_cpus, thread_times
from profiles import (
    CLASSIC_PLUGINS,
    FULL_PLUGINS,
    LIMITS_VARIANTS,
    LimitsVariant,
    add_profile,
    forget_prefixes,
    limits_prefix,
    redis_answers,
    verify_variant,
    write_full_profile,
)
from run import (
    add_without,
    fake_upstream_argv,
    free_port,
    http_request,
    line_env,
    write_prism_config,
)

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
UPSTREAM, BARE, PRISM, ROUTED, WORKERS, SHARED = 18977, 18979, 18978, 18976, 18975, 18974
WITHOUT = 18973
#: The provider kinds ``--lines`` puts Prism's one line on, besides OpenAI's.
LINE_KINDS = ("gemini", "bedrock")
#: The full profile's targets take ports from here up (one per plugin left out, plus one).
FULL_BASE = 18950


def on_cpus(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that runs a child (and its children) on ``cpus``; None: anywhere."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


async def load(
    port: int,
    stream: bool,
    duration: int,
    key: str | None = None,
    cpus: set[int] | None = None,
    api: str = "chat",
) -> tuple[int, int]:
    """Run wrk against ``port``; the requests it completed, and how many were not 2xx.

    ``api``: ``chat`` (``/v1/chat/completions``), ``responses`` (``/v1/responses``)
    or ``no-cache`` (chat with ``Cache-Control: no-cache``: a cache's miss, stored),
    ``distinct`` (chat, every prompt distinct: the full profile's cache misses each).
    """
    env = {
        **os.environ,
        "BENCH_STREAM": "1" if stream else "0",
        "BENCH_KEY": key or "",
        "BENCH_API": api,
        "BENCH_HEADERS": "Cache-Control: no-cache" if api == "no-cache" else "",
        # Every prompt distinct, unlike any of an earlier run: the full profile's cache misses.
        "BENCH_DISTINCT": secrets.token_hex(6) if api == "distinct" else "",
    }
    path = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    wrk = await asyncio.create_subprocess_exec(
        "wrk",
        "-t2",
        "-c16",
        f"-d{duration}s",
        "-s",
        str(HERE / "post.lua"),
        f"http://127.0.0.1:{port}{path}",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        preexec_fn=on_cpus(cpus),
    )
    out, _ = await wrk.communicate()
    lines = out.decode().splitlines()
    line = next(line for line in lines if "requests in" in line)
    failed = next((int(x.split()[-1]) for x in lines if "Non-2xx" in x), 0)
    return int(line.split()[0]), failed


def start(
    argv: Sequence[str | Path], cpus: set[int] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=on_cpus(cpus),
        env={**os.environ, **env} if env else None,
    )


async def main(
    duration: int,
    routing: bool,
    workers: int,
    redis_url: str,
    without: Sequence[str] = (),
    profile: str = "default",
    threads: bool = False,
    rounds: int = 3,
    pinned: bool = True,
    lines: bool = False,
    cache: bool = False,
) -> None:
    cpus = split_cpus() if pinned else None
    # Servers under test on one CPU, the load and the fake on the others.
    under_test, others = cpus if cpus is not None else (None, None)
    with tempfile.TemporaryDirectory() as scratch:
        upstream_base = f"http://127.0.0.1:{UPSTREAM}/s/ok/v1"
        config = write_prism_config(Path(scratch), PRISM, upstream_base)
        routed_dir = Path(scratch) / "routed"
        routed_dir.mkdir()
        routed_config = write_prism_config(routed_dir, ROUTED, upstream_base, routing=True)
        upstream = start(fake_upstream_argv(UPSTREAM), others)
        bare = start(
            [
                sys.executable,
                HERE / "bare_proxy.py",
                "--port",
                str(BARE),
                "--upstream",
                f"http://127.0.0.1:{UPSTREAM}/s/ok/v1",
            ],
            under_test,
        )
        prism = start([BIN / "prism", "serve", "--config", config], under_test)
        # (name, process, port, API key, the API called: chat or responses)
        targets: list[tuple[str, subprocess.Popen[bytes], int, str | None, str]] = [
            ("bare proxy", bare, BARE, None, "chat"),
            ("prism", prism, PRISM, None, "chat"),
        ]
        if lines:
            # The same Prism called through the Responses API (translated to chat), and
            # Prism with its one line on each other wire the fake upstream speaks.
            targets.append(("prism responses", prism, PRISM, None, "responses"))
            for kind in LINE_KINDS:
                port = free_port()
                here = Path(scratch) / kind
                here.mkdir()
                ini = write_prism_config(here, port, upstream_base, kind=kind)
                line_argv: list[str | Path] = [BIN / "prism", "serve", "--config", ini]
                process = start(line_argv, under_test, line_env(kind))
                targets.append((f"prism {kind} line", process, port, None, "chat"))
        if cache:
            # Prism with prism-cache's memory store: every call after the first a hit, and
            # the same Prism asked to skip the lookup (a miss that is stored), against prism.
            port = free_port()
            here = Path(scratch) / "cache"
            here.mkdir()
            ini = write_prism_config(here, port, upstream_base, cache=True)
            cached = start([BIN / "prism", "serve", "--config", ini], under_test)
            targets.append(("prism cache hit", cached, port, None, "chat"))
            targets.append(("prism cache miss", cached, port, None, "no-cache"))
        if profile in ("full", "full-classic", "limits"):
            # Prism as operators run it, and once without each plugin: its marginal cost.
            classic = profile != "full"
            plugins = CLASSIC_PLUGINS if classic else FULL_PLUGINS
            left_outs = (None, *plugins) if profile != "limits" else (None,)
            for i, left_out in enumerate(left_outs):
                name = "full" if left_out is None else f"full -{left_out}"
                port = FULL_BASE + i
                ini, key = write_full_profile(
                    Path(scratch) / name.replace(" ", ""), port, upstream_base,
                    without=left_out, classic=classic,
                )  # fmt: skip
                argv: list[str | Path] = [BIN / "prism", "serve", "--config", ini]
                api = "chat" if classic else "distinct"
                targets.append((name, start(argv, under_test), port, key, api))
        variants: dict[str, tuple[LimitsVariant, int, str | None]] = {}
        prefixes: list[str] = []
        if profile == "limits":
            # The full profile plus prism-limits, each variant on a free port of its own.
            away = redis_answers(redis_url)
            base = limits_prefix()
            for number, variant in enumerate(LIMITS_VARIANTS):
                if variant.redis and away is not None:
                    print(f"{variant.name}: left out, {away}")
                    continue
                prefix = f"{base}-{number}"
                if variant.redis:
                    prefixes.append(prefix)
                port = free_port()
                ini, key = write_full_profile(
                    Path(scratch) / f"limits-{number}",
                    port,
                    upstream_base,
                    variant=variant,
                    redis=(redis_url, prefix),
                )
                argv = [BIN / "prism", "serve", "--config", ini]
                targets.append((variant.name, start(argv, under_test), port, key, "chat"))
                variants[variant.name] = (variant, port, key)
        if routing:
            routed = start([BIN / "prism", "serve", "--config", routed_config], under_test)
            targets.append(("prism+route", routed, ROUTED, None, "chat"))
        for name in without:
            here = Path(scratch) / f"without-{name}"
            here.mkdir()
            ini = write_prism_config(here, WITHOUT, upstream_base, disable=(name,))
            argv = [BIN / "prism", "serve", "--config", ini]
            targets.append((f"prism -{name}", start(argv, under_test), WITHOUT, None, "chat"))
        if workers > 1:
            # The breaker refuses workers unless its state is shared: both targets
            # share it through Redis, so they differ only in the process count.
            for name, port, count in (
                ("prism+redis", SHARED, 1),
                (f"prism x{workers}", WORKERS, workers),
            ):
                here = Path(scratch) / name
                here.mkdir()
                ini = write_prism_config(here, port, upstream_base, redis_url=redis_url)
                argv = [BIN / "prism", "serve", "--config", ini, "--workers", str(count)]
                # Unpinned, both: workers on one CPU would measure nothing of a second one.
                targets.append((name, start(argv), port, None, "chat"))
        try:
            for name, process, port, *_ in targets:
                wait_ready(name, process, port, "/healthz" if name == "bare proxy" else "/readyz")
            cpu: dict[tuple[str, bool], float] = {}
            # Only one-process targets: a supervisor's threads say nothing of its workers'.
            split_names = {n for n, *_ in targets if threads and not n.startswith("prism x")}
            for stream in (False, True):
                kind = "stream    " if stream else "non-stream"
                each: dict[str, list[float]] = {name: [] for name, *_ in targets}
                served_total = dict.fromkeys(each, 0)
                failed_total = dict.fromkeys(each, 0)
                split_total = {name: [0.0, 0.0, 0.0, 0.0] for name in each}
                for round_ in range(rounds):
                    order = targets if round_ % 2 == 0 else targets[::-1]
                    for name, process, port, key, api in order:
                        before = cpu_seconds(process.pid)
                        split_before = thread_times(process.pid) if name in split_names else None
                        served, failed = await load(port, stream, duration, key, others, api)
                        spent = cpu_seconds(process.pid) - before
                        each[name].append(spent / max(served, 1) * 1e6)
                        served_total[name] += served
                        failed_total[name] += failed
                        if split_before is not None:
                            after = thread_times(process.pid)
                            for i, (now, then) in enumerate(zip(after, split_before, strict=True)):
                                split_total[name][i] += now - then
                for name, *_ in targets:
                    median = cpu[name, stream] = statistics.median(each[name])
                    served = served_total[name]
                    rate = served / (duration * rounds)
                    errors = f"  ({failed_total[name]} NOT 2xx)" if failed_total[name] else ""
                    print(
                        f"{kind} {name:16} {served:6d} requests {rate:7.0f}/s "
                        f"{median:5.0f} us CPU each{errors}"
                    )
                    if name in split_names:
                        split = [part / max(served, 1) * 1e6 for part in split_total[name]]
                        print(
                            f"{'':28} main thread {split[0]:4.0f} user {split[1]:4.0f} system, "
                            f"other threads {split[2]:4.0f} user {split[3]:4.0f} system (us each)"
                        )
            if variants:
                report_limits(cpu, variants)
            others_than_prism = [
                *(
                    ("prism responses", *(f"prism {kind} line" for kind in LINE_KINDS))
                    if lines
                    else ()
                ),
                *(("prism cache hit", "prism cache miss") if cache else ()),
            ]
            if others_than_prism:
                print("\nagainst prism (a chat call on an OpenAI line), same run, median CPU:")
                for name in others_than_prism:
                    ratios = [cpu[name, stream] / cpu["prism", stream] for stream in (False, True)]
                    extra = [cpu[name, stream] - cpu["prism", stream] for stream in (False, True)]
                    print(
                        f"  {name:20} non-stream {ratios[0]:.2f}x ({extra[0]:+4.0f} us)   "
                        f"stream {ratios[1]:.2f}x ({extra[1]:+4.0f} us)"
                    )
            if profile in ("full", "full-classic"):
                print("\nmarginal CPU per request (full minus full without the plugin):")
                for plugin in FULL_PLUGINS if profile == "full" else CLASSIC_PLUGINS:
                    costs = [
                        cpu["full", stream] - cpu[f"full -{plugin}", stream]
                        for stream in (False, True)
                    ]
                    print(
                        f"  {plugin:16} non-stream {costs[0]:+5.0f} us   stream {costs[1]:+5.0f} us"
                    )
        finally:
            # One process may be two targets (the same Prism called through two APIs).
            processes = {id(p): p for p in (upstream, *(target[1] for target in targets))}
            for process in processes.values():
                process.terminate()
            for process in processes.values():
                process.wait(15)
            if workers > 1:
                forget_shared_state(redis_url, (SHARED, WORKERS))
            if prefixes:
                forget_prefixes(redis_url, prefixes)


def wait_ready(name: str, process: subprocess.Popen[bytes], port: int, path: str) -> None:
    """Until the server answers ``path`` with 200 (many start at once on one CPU: slowly)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before it was ready")
        with contextlib.suppress(OSError):
            if http_request(port, "GET", path, timeout=2.0)[0] == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{name} was not ready after 120 s")


def report_limits(
    cpu: dict[tuple[str, bool], float], variants: dict[str, tuple[LimitsVariant, int, str | None]]
) -> None:
    """Each limits variant against its reference measured in the same run, checked first."""
    print("\nthe limits profile against its references (same run, median CPU per request):")
    for name, (variant, port, key) in variants.items():
        # After the load: a Redis that timed out under it would have the limits count locally.
        problem = verify_variant(port, variant, key)
        if problem is not None:
            print(f"  {name}: NOT WHAT IT SHOULD BE ({problem}): its figures mean something else")
        for reference in dict.fromkeys((variant.reference, "full")):
            cells = []
            for stream in (False, True):
                ours, theirs = cpu[name, stream], cpu[reference, stream]
                kind = "stream" if stream else "non-stream"
                cells.append(f"{kind} {ours / theirs:.3f}x ({ours - theirs:+4.0f} us)")
            print(f"  {name + ' / ' + reference:30} {'   '.join(cells)}")


def forget_shared_state(redis_url: str, ports: Sequence[int]) -> None:
    """Delete the keys the ``--workers`` targets left in Redis (their prefixes are the bench's)."""
    forget_prefixes(redis_url, [f"prism-bench-{port}" for port in ports])


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--duration", type=int, default=2, help="seconds of load per target and round (2)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per kind of call, targets taking turns (3)"
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let every process run on any CPU (default: servers under test on one CPU)",
    )
    parser.add_argument(
        "--routing",
        action="store_true",
        help="also measure Prism with regions, the compatibility gate and a scoring group on",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="also measure prism serve --workers N (N > 1) and one process, both with prism-redis",
    )
    parser.add_argument(
        "--redis",
        default="redis://127.0.0.1:6379/0",
        help="the Redis --workers and --profile limits share state in",
    )
    parser.add_argument(
        "--lines",
        action="store_true",
        help="also a Responses API call translated to chat, and Prism's line on each other "
        "wire (Gemini, Bedrock), each against a chat call on an OpenAI line",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="also Prism with prism-cache's memory store: a hit, and a miss that is stored "
        "(Cache-Control: no-cache), each against prism",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also split each one-process target's CPU between its main and other threads",
    )
    add_without(parser)
    add_profile(
        parser,
        "also Prism with every bundled plugin on, and without each in turn",
        limits="also the full profile, then the same with prism-limits: no limit applying, "
        "limits applying counted in the process, and counted in Redis",
    )
    args = parser.parse_args(argv)
    asyncio.run(
        main(
            args.duration,
            args.routing,
            args.workers,
            args.redis,
            args.without[:1],
            args.profile,
            args.threads,
            max(1, args.rounds),
            not args.no_pin,
            args.lines,
            args.cache,
        )
    )


if __name__ == "__main__":
    cli()
