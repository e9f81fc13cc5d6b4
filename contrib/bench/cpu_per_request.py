"""CPU time per request: the bare aiohttp proxy and Prism, under the same wrk load.

Throughput on a shared two-core machine swings from run to run with whatever
else runs; the CPU a proxy process spends per request does not.  This script
starts the fake upstream, the bare proxy and ``prism serve`` (one provider, one
model), drives each with ``wrk -t2 -c16`` for a few seconds, non-streaming and
streaming, and prints the process CPU time (user + system, from /proc) divided
by the requests served.  Linux only.

    python contrib/bench/cpu_per_request.py [--duration 4] [--routing]
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

from run import write_prism_config

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
UPSTREAM, BARE, PRISM, ROUTED = 18977, 18979, 18978, 18976


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(port: int, stream: bool, duration: int) -> int:
    """Run wrk against ``port``; the number of requests it completed."""
    env = {**os.environ, "BENCH_STREAM": "1" if stream else "0"}
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
    line = next(line for line in out.decode().splitlines() if "requests in" in line)
    return int(line.split()[0])


def start(argv: Sequence[str | Path]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def main(duration: int, routing: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        upstream_base = f"http://127.0.0.1:{UPSTREAM}/s/ok/v1"
        config = write_prism_config(Path(scratch), PRISM, upstream_base)
        routed_dir = Path(scratch) / "routed"
        routed_dir.mkdir()
        routed_config = write_prism_config(routed_dir, ROUTED, upstream_base, routing=True)
        upstream = start([BIN / "prism-fake-upstream", "--port", str(UPSTREAM)])
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
        targets = [("bare proxy", bare, BARE), ("prism", prism, PRISM)]
        if routing:
            routed = start([BIN / "prism", "serve", "--config", routed_config])
            targets.append(("prism+route", routed, ROUTED))
        try:
            await asyncio.sleep(3)
            for stream in (False, True):
                for name, process, port in targets:
                    before = cpu_seconds(process.pid)
                    served = await load(port, stream, duration)
                    spent = cpu_seconds(process.pid) - before
                    kind = "stream    " if stream else "non-stream"
                    each = spent / served * 1e6
                    print(f"{kind} {name:10} {served:6d} requests  {each:5.0f} us CPU each")
        finally:
            for process in (upstream, *(target[1] for target in targets)):
                process.kill()


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=4, help="seconds of load per cell")
    parser.add_argument(
        "--routing",
        action="store_true",
        help="also measure Prism with regions, the compatibility gate and a scoring group on",
    )
    args = parser.parse_args(argv)
    asyncio.run(main(args.duration, args.routing))


if __name__ == "__main__":
    cli()
