"""CPU time per request: the bare aiohttp proxy and Prism, under the same wrk load.

Throughput on a shared two-core machine swings from run to run with whatever
else runs; the CPU a proxy process spends per request does not.  This script
starts the fake upstream, the bare proxy and ``prism serve`` (one provider, one
model), drives each with ``wrk -t2 -c16`` for a few seconds, non-streaming and
streaming, and prints the process CPU time (user + system, from /proc) divided
by the requests served, and the calls per second wrk saw.  Linux only.
``--workers N`` adds ``prism serve --workers N`` (its CPU is the supervisor's
and every worker's) and, to compare it with, one process with the same
configuration; both share the breaker's state through prism-redis (``--redis``).
``--threads`` splits each one-process target's CPU per request between its
main thread (the event loop) and its other threads (the ledger's writer),
user and system time apart.

    python contrib/bench/cpu_per_request.py [--duration 4] [--routing] [--workers 2] [--threads]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from proc import cpu_seconds, thread_times
from profiles import FULL_PLUGINS, add_profile, write_full_profile
from run import add_without, fake_upstream_argv, write_prism_config

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
UPSTREAM, BARE, PRISM, ROUTED, WORKERS, SHARED = 18977, 18979, 18978, 18976, 18975, 18974
WITHOUT = 18973
#: The full profile's targets take ports from here up (one per plugin left out, plus one).
FULL_BASE = 18950


async def load(port: int, stream: bool, duration: int, key: str | None = None) -> tuple[int, int]:
    """Run wrk against ``port``; the requests it completed, and how many were not 2xx."""
    env = {**os.environ, "BENCH_STREAM": "1" if stream else "0", "BENCH_KEY": key or ""}
    wrk = await asyncio.create_subprocess_exec(
        "wrk",
        "-t2",
        "-c16",
        f"-d{duration}s",
        "-s",
        str(HERE / "post.lua"),
        f"http://127.0.0.1:{port}/v1/chat/completions",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await wrk.communicate()
    lines = out.decode().splitlines()
    line = next(line for line in lines if "requests in" in line)
    failed = next((int(x.split()[-1]) for x in lines if "Non-2xx" in x), 0)
    return int(line.split()[0]), failed


def start(argv: Sequence[str | Path]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def main(
    duration: int,
    routing: bool,
    workers: int,
    redis_url: str,
    without: Sequence[str] = (),
    profile: str = "default",
    threads: bool = False,
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        upstream_base = f"http://127.0.0.1:{UPSTREAM}/s/ok/v1"
        config = write_prism_config(Path(scratch), PRISM, upstream_base)
        routed_dir = Path(scratch) / "routed"
        routed_dir.mkdir()
        routed_config = write_prism_config(routed_dir, ROUTED, upstream_base, routing=True)
        upstream = start(fake_upstream_argv(UPSTREAM))
        bare = start(
            [
                sys.executable,
                HERE / "bare_proxy.py",
                "--port",
                str(BARE),
                "--upstream",
                f"http://127.0.0.1:{UPSTREAM}/s/ok/v1",
            ]
        )
        prism = start([BIN / "prism", "serve", "--config", config])
        targets: list[tuple[str, subprocess.Popen[bytes], int, str | None]] = [
            ("bare proxy", bare, BARE, None),
            ("prism", prism, PRISM, None),
        ]
        if profile == "full":
            # Prism as operators run it, and once without each plugin: its marginal cost.
            for i, left_out in enumerate((None, *FULL_PLUGINS)):
                name = "full" if left_out is None else f"full -{left_out}"
                port = FULL_BASE + i
                ini, key = write_full_profile(
                    Path(scratch) / name.replace(" ", ""), port, upstream_base, without=left_out
                )
                targets.append((name, start([BIN / "prism", "serve", "--config", ini]), port, key))
        if routing:
            routed = start([BIN / "prism", "serve", "--config", routed_config])
            targets.append(("prism+route", routed, ROUTED, None))
        for name in without:
            here = Path(scratch) / f"without-{name}"
            here.mkdir()
            ini = write_prism_config(here, WITHOUT, upstream_base, disable=(name,))
            targets.append(
                (f"prism -{name}", start([BIN / "prism", "serve", "--config", ini]), WITHOUT, None)
            )
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
                argv: list[str | Path] = [
                    BIN / "prism",
                    "serve",
                    "--config",
                    ini,
                    "--workers",
                    str(count),
                ]
                targets.append((name, start(argv), port, None))
        try:
            await asyncio.sleep(3 + len(targets) / 2)
            cpu: dict[tuple[str, bool], float] = {}
            for stream in (False, True):
                for name, process, port, key in targets:
                    # Only one-process targets: a supervisor's threads say nothing of its workers'.
                    split_threads = threads and not name.startswith("prism x")
                    before = cpu_seconds(process.pid)
                    split_before = thread_times(process.pid) if split_threads else None
                    served, failed = await load(port, stream, duration, key)
                    spent = cpu_seconds(process.pid) - before
                    kind = "stream    " if stream else "non-stream"
                    each = cpu[name, stream] = spent / max(served, 1) * 1e6
                    rate = served / duration
                    errors = f"  ({failed} NOT 2xx)" if failed else ""
                    print(
                        f"{kind} {name:16} {served:6d} requests {rate:7.0f}/s "
                        f"{each:5.0f} us CPU each{errors}"
                    )
                    if split_before is not None:
                        split = [
                            (after - then) / max(served, 1) * 1e6
                            for after, then in zip(
                                thread_times(process.pid), split_before, strict=True
                            )
                        ]
                        print(
                            f"{'':28} main thread {split[0]:4.0f} user {split[1]:4.0f} system, "
                            f"other threads {split[2]:4.0f} user {split[3]:4.0f} system (us each)"
                        )
            if profile == "full":
                print("\nmarginal CPU per request (full minus full without the plugin):")
                for plugin in FULL_PLUGINS:
                    costs = [
                        cpu["full", stream] - cpu[f"full -{plugin}", stream]
                        for stream in (False, True)
                    ]
                    print(
                        f"  {plugin:16} non-stream {costs[0]:+5.0f} us   stream {costs[1]:+5.0f} us"
                    )
        finally:
            for process in (upstream, *(target[1] for target in targets)):
                process.terminate()
            for process in (upstream, *(target[1] for target in targets)):
                process.wait(15)
            if workers > 1:
                forget_shared_state(redis_url, (SHARED, WORKERS))


def forget_shared_state(redis_url: str, ports: Sequence[int]) -> None:
    """Delete the keys the ``--workers`` targets left in Redis (their prefixes are the bench's)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for port in ports:
            keys = list(client.scan_iter(match=f"prism-bench-{port}:*", count=500))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=4, help="seconds of load per cell")
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
        "--redis", default="redis://127.0.0.1:6379/0", help="the Redis --workers shares state in"
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also split each one-process target's CPU between its main and other threads",
    )
    add_without(parser)
    add_profile(parser, "also Prism with every bundled plugin on, and without each in turn")
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
        )
    )


if __name__ == "__main__":
    cli()
