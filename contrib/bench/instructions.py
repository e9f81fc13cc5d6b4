"""Instructions per request: the bare aiohttp proxy and Prism, counted by callgrind.

CPU time per request still moves a few per cent from run to run on a shared
machine; the number of instructions a proxy executes per request does not
(it repeats within about 0.2%), so it is the measure to use when judging a
small change.  Each proxy runs under ``valgrind --tool=callgrind`` with
instrumentation off; after a warm-up it is switched on for a fixed number of
requests (sent by this script, at a small concurrency, over loopback) and off
again.  Counts are user-space instructions only: system calls are not in them.
Needs valgrind (Debian: ``apt-get install valgrind``).

    python contrib/bench/instructions.py [--requests 400] [--concurrency 4] [--scenario ok]
    python contrib/bench/instructions.py --profile full [--without billing ...]

``--scenario slow`` has the fake pause between tokens, so a stream arrives
one event per read, as from a real model.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from cpu_per_request import forget_shared_state
from profiles import add_profile, write_full_profile
from run import add_without, fake_upstream_argv, write_prism_config

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
UPSTREAM, PROXY = 18987, 18988
BODY = b'{"model":"bench","messages":[{"role":"user","content":"Say hello in ten words."}]'


async def drive(
    count: int, concurrency: int, stream: bool, ready_path: str, key: str | None = None
) -> None:
    """Send ``count`` chat requests to the proxy, reading every answer to its end."""
    url = f"http://127.0.0.1:{PROXY}"
    body = BODY + (b',"stream":true}' if stream else b"}")
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with aiohttp.ClientSession() as session:
        for _ in range(600):  # valgrind starts Python slowly
            try:
                async with session.get(url + ready_path) as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post(
                    url + "/v1/chat/completions",
                    data=body,
                    headers=headers,
                ) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"the proxy answered {response.status}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def total_instructions(out_file: Path) -> int:
    annotated = subprocess.run(
        ["callgrind_annotate", str(out_file)], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"^\s*([\d,]+)\s.*PROGRAM TOTALS", annotated, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no totals in {out_file}")
    return int(match.group(1).replace(",", ""))


def count(
    argv: list[str], ready_path: str, stream: bool, args: argparse.Namespace, key: str | None
) -> float:
    """Instructions per request of the proxy started by ``argv`` (sent ``key``, if any)."""
    with tempfile.TemporaryDirectory() as scratch:
        out_file = Path(scratch) / "callgrind.out"
        proxy = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out_file}",
                *argv,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            asyncio.run(drive(args.warmup, args.concurrency, stream, ready_path, key))
            toggle = ["callgrind_control", "--instr"]
            subprocess.run([*toggle, "on", str(proxy.pid)], capture_output=True, check=True)
            asyncio.run(drive(args.requests, args.concurrency, stream, ready_path, key))
            subprocess.run([*toggle, "off", str(proxy.pid)], capture_output=True, check=True)
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(timeout=60)
        requests: int = args.requests
        return total_instructions(out_file) / requests


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        upstream_base = f"http://127.0.0.1:{UPSTREAM}/s/{args.scenario}/v1"
        config = write_prism_config(Path(scratch), PROXY, upstream_base)
        proxies: dict[str, tuple[list[str], str, str | None]] = {
            "bare proxy": (
                [
                    sys.executable,
                    str(HERE / "bare_proxy.py"),
                    "--port",
                    str(PROXY),
                    "--upstream",
                    upstream_base,
                ],
                "/healthz",
                None,
            ),
            "prism": ([str(BIN / "prism"), "serve", "--config", str(config)], "/readyz", None),
        }
        if args.profile == "full":
            # Every bundled plugin on; with --without, that plugin is left out of it.
            for left_out in (None, *args.without):
                name = "full" if left_out is None else f"full -{left_out}"
                ini, key = write_full_profile(
                    Path(scratch) / name.replace(" ", ""), PROXY, upstream_base, without=left_out
                )
                proxies[name] = (
                    [str(BIN / "prism"), "serve", "--config", str(ini)],
                    "/readyz",
                    key,
                )
        for name in args.without if args.profile != "full" else ():
            # The same Prism with one plugin disabled: what that plugin costs.
            here = Path(scratch) / f"without-{name}"
            here.mkdir()
            ini = write_prism_config(here, PROXY, upstream_base, disable=(name,))
            proxies[f"prism -{name}"] = (
                [str(BIN / "prism"), "serve", "--config", str(ini)],
                "/readyz",
                None,
            )
        if args.redis:
            # The same, its breaker state shared through prism-redis (background
            # exchanges included: they run while the requests are counted).
            shared_dir = Path(scratch) / "redis"
            shared_dir.mkdir()
            shared = write_prism_config(shared_dir, PROXY, upstream_base, redis_url=args.redis)
            proxies["prism+redis"] = (
                [str(BIN / "prism"), "serve", "--config", str(shared)],
                "/readyz",
                None,
            )
        upstream = subprocess.Popen(
            fake_upstream_argv(UPSTREAM),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for stream in (False, True):
                kind = "stream    " if stream else "non-stream"
                each = {}
                for name, (argv, ready_path, key) in proxies.items():
                    each[name] = count(argv, ready_path, stream, args, key)
                    print(f"{kind} {name:16} {each[name]:11,.0f} instructions per request")
                for name in proxies:
                    if name.startswith("prism") or name == "full":
                        ratio = each["bare proxy"] / each[name]
                        print(f"{kind} bare proxy / {name} {ratio:.2f}x (as 'vs bare' in run.py)")
                for name in proxies:
                    if name.startswith("full -"):
                        cost = each["full"] - each[name]
                        print(f"{kind} marginal {name[6:]:16} {cost:+11,.0f} instructions")
        finally:
            upstream.kill()
            if args.redis:
                forget_shared_state(args.redis, (PROXY,))


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=400, help="requests counted (400)")
    parser.add_argument("--warmup", type=int, default=200, help="requests before counting (200)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    parser.add_argument("--scenario", default="ok", help="fake upstream scenario (ok; slow)")
    parser.add_argument(
        "--redis", metavar="URL", help="also count Prism sharing its state through this Redis"
    )
    add_without(parser)
    add_profile(parser, "also Prism with every bundled plugin on (--without: and without that one)")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"{', '.join(missing)} not found: apt-get install valgrind", file=sys.stderr)
        return 2
    main(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
