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
    python contrib/bench/instructions.py --profile limits [--redis redis://127.0.0.1:6379/0]

``--scenario slow`` has the fake pause between tokens, so a stream arrives
one event per read, as from a real model.  ``--profile limits`` counts the
full profile, then the same with prism-limits (no limit applying; limits
applying, counted in the process; counted in Redis, beside the full profile
with prism-redis alone) and prints each against its reference.  The servers
listen on free ports of 127.0.0.1, so two runs at once do not collide.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from profiles import (
    LIMITS_VARIANTS,
    LimitsVariant,
    add_profile,
    forget_prefixes,
    limits_prefix,
    redis_answers,
    verify_variant,
    write_full_profile,
)
from run import add_without, fake_upstream_argv, free_port, write_prism_config

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
BODY = b'{"model":"bench","messages":[{"role":"user","content":"Say hello in ten words."}]'
#: The Redis of ``--profile limits`` when ``--redis`` names none.
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Proxy:
    """One proxy under test: how to start it, when it is ready, the key it is sent."""

    argv: list[str]
    ready_path: str = "/readyz"
    key: str | None = None
    #: The limits profile's variant it is (checked after counting), if any.
    variant: LimitsVariant | None = None
    #: Every prompt distinct (the full profile: its cache misses every call).
    distinct: bool = False


async def drive(
    port: int,
    count: int,
    concurrency: int,
    stream: bool,
    ready_path: str,
    key: str | None = None,
    distinct: bool = False,
) -> None:
    """Send ``count`` chat requests to the proxy, reading every answer to its end
    (``distinct``: each prompt ends with a mark no other request has)."""
    url = f"http://127.0.0.1:{port}"
    body = BODY + (b',"stream":true}' if stream else b"}")
    word = secrets.token_hex(6).encode()
    sent = 0
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
            nonlocal left, sent
            while left > 0:
                left -= 1
                sent += 1
                mark = b" #%s-%d" % (word, sent)
                async with session.post(
                    url + "/v1/chat/completions",
                    data=body.replace(b'words."', b"words." + mark + b'"') if distinct else body,
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


def count(proxy: Proxy, port: int, stream: bool, args: argparse.Namespace, name: str) -> float:
    """Instructions per request of ``proxy`` (called ``name``), listening on ``port``."""
    with tempfile.TemporaryDirectory() as scratch:
        out_file = Path(scratch) / "callgrind.out"
        if args.keep is not None:
            kind = "stream" if stream else "non-stream"
            label = re.sub(r"[^\w.+-]+", "_", name)
            out_file = args.keep / f"callgrind.{kind}.{label}.out"
        process = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out_file}",
                *proxy.argv,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            warm = drive(
                port, args.warmup, args.concurrency, stream, proxy.ready_path, proxy.key,
                proxy.distinct,
            )  # fmt: skip
            asyncio.run(warm)
            toggle = ["callgrind_control", "--instr"]
            subprocess.run([*toggle, "on", str(process.pid)], capture_output=True, check=True)
            counted = drive(
                port, args.requests, args.concurrency, stream, proxy.ready_path, proxy.key,
                proxy.distinct,
            )  # fmt: skip
            asyncio.run(counted)
            subprocess.run([*toggle, "off", str(process.pid)], capture_output=True, check=True)
            if proxy.variant is not None:
                # After counting (not counted): did it measure what its name says?
                problem = verify_variant(port, proxy.variant, proxy.key)
                if problem is not None:
                    raise RuntimeError(f"{proxy.variant.name} is not what it should be: {problem}")
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
        requests: int = args.requests
        return total_instructions(out_file) / requests


def proxies_of(
    args: argparse.Namespace, scratch: Path, port: int, upstream_base: str, prefixes: list[str]
) -> dict[str, Proxy]:
    """Every proxy this run counts, by name (the Redis key prefixes used added to ``prefixes``)."""
    config = write_prism_config(scratch, port, upstream_base)
    proxies = {
        "bare proxy": Proxy(
            [
                sys.executable,
                str(HERE / "bare_proxy.py"),
                "--port",
                str(port),
                "--upstream",
                upstream_base,
            ],
            "/healthz",
        ),
        "prism": Proxy([str(BIN / "prism"), "serve", "--config", str(config)]),
    }
    if args.profile in ("full", "full-classic", "limits"):
        # Every bundled plugin on; with --without, that plugin is left out of it.
        classic = args.profile != "full"
        for left_out in (None, *args.without):
            name = "full" if left_out is None else f"full -{left_out}"
            ini, key = write_full_profile(
                scratch / name.replace(" ", ""), port, upstream_base, without=left_out,
                classic=classic,
            )  # fmt: skip
            argv = [str(BIN / "prism"), "serve", "--config", str(ini)]
            proxies[name] = Proxy(argv, key=key, distinct=not classic)
    if args.profile == "limits":
        url = args.redis or LOCAL_REDIS
        away = redis_answers(url)
        base = limits_prefix()
        for number, variant in enumerate(LIMITS_VARIANTS):
            if variant.redis and away is not None:
                print(f"{variant.name}: left out, {away}")
                continue
            prefix = f"{base}-{number}"
            if variant.redis:
                prefixes.append(prefix)
            here = scratch / f"limits-{number}"
            ini, key = write_full_profile(
                here, port, upstream_base, variant=variant, redis=(url, prefix)
            )
            argv = [str(BIN / "prism"), "serve", "--config", str(ini)]
            proxies[variant.name] = Proxy(argv, key=key, variant=variant)
    for name in args.without if args.profile == "default" else ():
        # The same Prism with one plugin disabled: what that plugin costs.
        here = scratch / f"without-{name}"
        here.mkdir()
        ini = write_prism_config(here, port, upstream_base, disable=(name,))
        proxies[f"prism -{name}"] = Proxy([str(BIN / "prism"), "serve", "--config", str(ini)])
    if args.redis:
        # The same, its breaker state shared through prism-redis (background
        # exchanges included: they run while the requests are counted).
        shared_dir = scratch / "redis"
        shared_dir.mkdir()
        shared = write_prism_config(shared_dir, port, upstream_base, redis_url=args.redis)
        prefixes.append(f"prism-bench-{port}")
        proxies["prism+redis"] = Proxy([str(BIN / "prism"), "serve", "--config", str(shared)])
    return proxies


def report(kind: str, each: dict[str, float], proxies: dict[str, Proxy]) -> None:
    """Ratios against the references measured in the same run."""
    for name in proxies:
        if name.startswith("prism") or name == "full":
            ratio = each["bare proxy"] / each[name]
            print(f"{kind} bare proxy / {name} {ratio:.2f}x (as 'vs bare' in run.py)")
    for name in proxies:
        if name.startswith("full -"):
            cost = each["full"] - each[name]
            print(f"{kind} marginal {name[6:]:16} {cost:+11,.0f} instructions")
    for name, proxy in proxies.items():
        variant = proxy.variant
        if variant is not None and variant.reference in each:
            ours, theirs = each[name], each[variant.reference]
            print(
                f"{kind} {name} / {variant.reference}: {ours / theirs:.3f}x "
                f"({ours - theirs:+,.0f} instructions, {(ours / theirs - 1) * 100:+.1f}%)"
            )
            if variant.reference != "full" and "full" in each:
                full = each["full"]
                print(
                    f"{kind} {name} / full: {ours / full:.3f}x "
                    f"({ours - full:+,.0f} instructions, {(ours / full - 1) * 100:+.1f}%)"
                )


def main(args: argparse.Namespace) -> None:
    prefixes: list[str] = []
    upstream_port, port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as scratch:
        upstream_base = f"http://127.0.0.1:{upstream_port}/s/{args.scenario}/v1"
        proxies = proxies_of(args, Path(scratch), port, upstream_base, prefixes)
        upstream = subprocess.Popen(
            fake_upstream_argv(upstream_port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for stream in (False, True):
                kind = "stream    " if stream else "non-stream"
                each = {}
                for name, proxy in proxies.items():
                    each[name] = count(proxy, port, stream, args, name)
                    print(f"{kind} {name:17} {each[name]:11,.0f} instructions per request")
                report(kind, each, proxies)
        finally:
            upstream.kill()
            if prefixes:
                forget_prefixes(args.redis or LOCAL_REDIS, prefixes)


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=400, help="requests counted (400)")
    parser.add_argument("--warmup", type=int, default=200, help="requests before counting (200)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    parser.add_argument("--scenario", default="ok", help="fake upstream scenario (ok; slow)")
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="also count Prism sharing its state through this Redis (and, with --profile "
        f"limits, the Redis its variants use instead of {LOCAL_REDIS})",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep each proxy's callgrind output in DIR (for callgrind_annotate: where it went)",
    )
    add_without(parser)
    add_profile(
        parser,
        "also Prism with every bundled plugin on (--without: and without that one)",
        limits="the full profile, then the same with prism-limits: no limit applying, "
        "limits applying counted in the process, and counted in Redis",
    )
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"{', '.join(missing)} not found: apt-get install valgrind", file=sys.stderr)
        return 2
    main(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
