"""Soak: a million mixed calls through one ``prism serve``, its memory sampled.

The full profile's plugins (keys, billing on SQLite, the breaker, regions,
metrics, the timeout header, limits applying, the cache's memory store,
responses loaded) serve a mix of calls sent by wrk (``soak.lua``): not
streamed and streamed with prompts never seen before (cache misses, stored),
calls on a model whose first line fails a share of its calls (the fake's
standing condition: the chain moves on), and calls repeating a few fixed
prompts (cache hits); beside it, a client of this script's own opens streams
and closes them after the first event (calls aborted by the caller).  Every
``--every`` calls (counted by Prism: ``prism_requests_total``) the resident
memory of the server's process tree is read (``VmRSS``); at the end it says
whether the last reading is within 5% of the one at a fifth of the calls
(the 200,000th of a million), and writes the curve as CSV and PNG.

    python contrib/bench/soak.py [--calls 1000000] [--every 10000] [--out DIR]

Only 127.0.0.1 is ever contacted.  See contrib/bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from proc import cpu_seconds, process_tree, split_cpus
from profiles import write_full_profile
from run import (
    HOST,
    find_wrk,
    free_port,
    http_request,
    in_scratch,
    running_servers,
    server_env,
    start_prism,
    start_upstream,
    wait_ready,
)

HERE = Path(__file__).resolve().parent
#: The growth allowed between a fifth of the calls and the end.
RSS_GROWTH_LIMIT = 0.05
#: The share of the failover model's first line's calls that fail.
FLAKY_ERRORS = {"503": 0.1}
CATALOG = """\
[providers.upstream]
kind = "openai"
base_url = "{root}/s/ok/v1"
region = "eu-west-1"

[providers.flaky]
kind = "openai"
base_url = "{root}/s/flaky/v1"
region = "eu-west-1"

[providers.slow]
kind = "openai"
base_url = "{root}/s/slow/v1"
region = "eu-west-1"

[models.bench]
chain = [ {{ provider = "upstream", model = "bench"{price} }} ]
cache = "all"

[models.failover]
# No retry of the failing line: its 503 moves the call down the chain at once.
retries = 0
chain = [ {{ provider = "flaky", model = "bench"{price} }},
          {{ provider = "upstream", model = "bench"{price} }} ]

[models.abort]
chain = [ {{ provider = "slow", model = "bench"{price} }} ]
"""
PRICE = ", price = { input = 1.0, output = 2.0 }"


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (``VmRSS``, summed)."""
    total = 0
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def metric_sums(port: int, name: str, label: str | None = None) -> Counter[str]:
    """``name``'s samples from ``/metrics`` summed by ``label`` (all under "" without)."""
    _, body = http_request(port, "GET", "/metrics", timeout=10)
    sums: Counter[str] = Counter()
    for line in body.decode().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        key = ""
        if label is not None and f'{label}="' in head:
            key = head.split(f'{label}="', 1)[1].split('"', 1)[0]
        sums[key] += int(float(value))
    return sums


def attempts_by(port: int, provider: str) -> Counter[str]:
    """``prism_attempts_total`` of ``provider``'s line, by verdict."""
    _, body = http_request(port, "GET", "/metrics", timeout=10)
    verdicts: Counter[str] = Counter()
    for line in body.decode().splitlines():
        if line.startswith("prism_attempts_total{") and f'provider="{provider}"' in line:
            head, _, value = line.rpartition(" ")
            verdict = head.split('verdict="', 1)[1].split('"', 1)[0] if "verdict=" in head else ""
            verdicts[verdict] += int(float(value))
    return verdicts


def calls_settled(port: int) -> int:
    try:
        return sum(metric_sums(port, "prism_requests_total").values())
    except (OSError, ValueError):
        return -1


# --------------------------------------------------------------------------- aborts


async def abort_streams(port: int, key: str, concurrency: int) -> None:
    """Open streams on the model ``abort`` and close each after its first event,
    until SIGTERM; then print how many were aborted, and what went wrong."""
    import aiohttp

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    counts: Counter[str] = Counter()
    body = {"model": "abort", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {key}"}

    async def one(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                async with session.post(
                    f"http://{HOST}:{port}/v1/chat/completions", json=body, headers=headers
                ) as response:
                    if response.status != 200:
                        counts[f"status {response.status}"] += 1
                        await response.read()
                        continue
                    await response.content.readany()
                    response.close()  # the connection goes with it: the caller left
                    counts["aborted"] += 1
            except (aiohttp.ClientError, OSError) as exc:
                counts[type(exc).__name__] += 1
                await asyncio.sleep(0.1)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(one(session)) for _ in range(concurrency)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(dict(counts)), flush=True)


# --------------------------------------------------------------------------- driver


def write_soak(
    directory: Path, port: int, root: str, cache_mb: int, without: str | None = None
) -> tuple[Path, str]:
    """The full profile's configuration with the soak's catalog (``without``: less that
    plugin); the API key."""
    if without == "keys":
        raise RuntimeError("the soak needs keys: the limits apply to the key's organisation")
    ini, key = write_full_profile(directory, port, f"{root}/s/ok/v1", without=without)
    if key is None:
        raise RuntimeError("the full profile made no key")
    catalog = CATALOG.format(root=root, price="" if without == "billing" else PRICE)
    if without == "cache":
        catalog = catalog.replace('cache = "all"\n', "")
    (directory / "catalog.toml").write_text(catalog)
    text = ini.read_text().replace(
        "[prism:cache]\nstore = memory\n",
        f"[prism:cache]\nstore = memory\nmax_bytes = {cache_mb * 1024 * 1024}\n",
    )
    ini.write_text(text)
    return ini, key


def soak(args: argparse.Namespace, wrk: str, work: Path) -> None:
    repo = HERE.parent.parent
    out = Path(args.out or f"/tmp/prism-soak-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    cpus = None if args.no_pin else split_cpus()
    under_test, load = (None, None) if cpus is None else cpus
    with running_servers(work) as servers:
        upstream_port, port = free_port(), free_port()
        start_upstream(servers, upstream_port, repo, load)
        root = f"http://{HOST}:{upstream_port}"
        condition = json.dumps({"errors": FLAKY_ERRORS, "seed": 1}).encode()
        status, _ = http_request(upstream_port, "PUT", "/_fake/condition/flaky", condition)
        if status != 200:
            raise RuntimeError(f"the fake refused the flaky condition: HTTP {status}")
        ini, key = write_soak(work / "prism", port, root, args.cache_mb, args.without)
        prism = start_prism(servers, "prism", ini, under_test)
        wait_ready(prism, port, "/readyz")
        pid = prism.proc.pid
        env = server_env()
        env.update(SOAK_KEY=key, SOAK_WORD=secrets.token_hex(6))
        pin = (lambda: os.sched_setaffinity(0, load)) if load else None
        aborter = subprocess.Popen(
            [sys.executable, __file__, "--abort-client", str(port), "--abort-concurrency",
             str(args.abort_concurrency)],
            env=env, stdout=subprocess.PIPE, text=True, preexec_fn=pin,
        ) if args.abort_concurrency > 0 else None  # fmt: skip
        wrk_proc = subprocess.Popen(
            [wrk, "-t2", f"-c{args.connections}", "-d24h", "--timeout", "10s", "--latency",
             "-s", str(HERE / "soak.lua"), f"http://{HOST}:{port}/v1/chat/completions"],
            env=env, stdout=subprocess.PIPE, text=True, preexec_fn=pin,
        )  # fmt: skip
        started, cpu_before = time.monotonic(), cpu_seconds(pid)
        samples: list[tuple[int, int, float]] = [(0, rss_bytes(pid), 0.0)]
        mark = args.every
        try:
            while True:
                time.sleep(args.poll)
                calls, elapsed = calls_settled(port), time.monotonic() - started
                if calls >= mark or calls >= args.calls:
                    samples.append((calls, rss_bytes(pid), elapsed))
                    mark = (calls // args.every + 1) * args.every
                    print(f"  {calls:>9} calls  {samples[-1][1] / 2**20:7.1f} MB  "
                          f"{elapsed:6.0f} s", file=sys.stderr, flush=True)  # fmt: skip
                if calls >= args.calls:
                    break
                if wrk_proc.poll() is not None or prism.proc.poll() is not None:
                    raise RuntimeError("wrk or prism stopped before the calls were made")
                if elapsed > args.max_minutes * 60:
                    print(f"stopped after --max-minutes {args.max_minutes}", file=sys.stderr)
                    break
        finally:
            for process, how in ((wrk_proc, signal.SIGINT), (aborter, signal.SIGTERM)):
                if process is not None and process.poll() is None:
                    process.send_signal(how)
        wrk_out, _ = wrk_proc.communicate(timeout=60)
        abort_out = "" if aborter is None else aborter.communicate(timeout=60)[0]
        elapsed, cpu = time.monotonic() - started, cpu_seconds(pid) - cpu_before
        report(args, out, samples, elapsed, cpu, port, wrk_out, abort_out)


def report(
    args: argparse.Namespace,
    out: Path,
    samples: Sequence[tuple[int, int, float]],
    elapsed: float,
    cpu: float,
    port: int,
    wrk_out: str,
    abort_out: str,
) -> None:
    calls = samples[-1][0]
    print(f"\n{calls} calls in {elapsed:.0f} s ({calls / elapsed:.0f}/s), "
          f"prism CPU {cpu / max(calls, 1) * 1e6:.0f} µs a call")  # fmt: skip
    line = next((x for x in wrk_out.splitlines() if x.startswith("BENCH_JSON ")), None)
    if line is not None:
        data = json.loads(line.removeprefix("BENCH_JSON "))
        errors = {k: v for k, v in data["errors"].items() if v}
        print(f"wrk: {data['requests']} calls, p50 {data['p50_us'] / 1000:.2f} ms, "
              f"p99 {data['p99_us'] / 1000:.2f} ms, errors {errors or 'none'}")  # fmt: skip
    print(f"abort client: {abort_out.strip() or 'no report'}")
    try:
        outcomes = metric_sums(port, "prism_requests_total", "outcome")
        fallbacks = metric_sums(port, "prism_fallbacks_total", "kind")
        lookups = metric_sums(port, "prism_cache_lookups_total", "result")
        flaky = Counter({v: n for v, n in attempts_by(port, "flaky").items() if n})
        print(f"outcomes: {dict(outcomes)}; fallbacks: {dict(fallbacks)}; "
              f"cache lookups: {dict(lookups)}; "
              f"the failing line's attempts: {dict(flaky)}")  # fmt: skip
    except (OSError, ValueError) as exc:
        print(f"could not read /metrics at the end: {exc}")
    reference_at = calls // 5
    reference = next((s for s in samples if s[0] >= reference_at), samples[-1])
    end = samples[-1]
    growth = end[1] / reference[1] - 1
    verdict = "PASS" if growth <= RSS_GROWTH_LIMIT else "FAIL"
    print(f"RSS at call {reference[0]}: {reference[1] / 2**20:.1f} MB; at the end (call "
          f"{end[0]}): {end[1] / 2**20:.1f} MB ({growth:+.1%}); within "
          f"{RSS_GROWTH_LIMIT:.0%}: {verdict}")  # fmt: skip
    half = next((s for s in samples if s[0] >= calls // 2), end)
    if end[0] > half[0]:
        slope = (end[1] - half[1]) / (end[0] - half[0]) * 100_000 / 2**20
        print(f"second half (calls {half[0]} to {end[0]}): {slope:+.2f} MB per 100,000 calls")
    path = out / "rss.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["calls", "rss_bytes", "seconds"])
        writer.writerows(samples)
    print(f"curve: {path}")
    try:
        plot(samples, reference, out / "rss.png")
        print(f"plot: {out / 'rss.png'}")
    except ImportError:
        print("no plot: matplotlib is not installed")


def plot(
    samples: Sequence[tuple[int, int, float]], reference: tuple[int, int, float], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s[0] for s in samples], [s[1] / 2**20 for s in samples], marker=".")
    limit = reference[1] / 2**20 * (1 + RSS_GROWTH_LIMIT)
    ax.axhline(
        limit, linestyle="--", color="grey", label=f"+{RSS_GROWTH_LIMIT:.0%} of call {reference[0]}"
    )
    ax.axvline(reference[0], linestyle=":", color="grey")
    ax.set_xlabel("calls")
    ax.set_ylabel("RSS (MB)")
    ax.set_title("prism serve resident memory over a soak")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls in all (1000000)")
    parser.add_argument("--every", type=int, default=0, help="calls between RSS readings "
                        "(default: a hundredth of --calls)")  # fmt: skip
    parser.add_argument("--connections", type=int, default=16, help="wrk's connections (16)")
    parser.add_argument(
        "--abort-concurrency",
        type=int,
        default=2,
        help="streams the abort client keeps open at once (2; 0: none)",
    )
    parser.add_argument("--cache-mb", type=int, default=8,
                        help="the cache's memory store bound, MB (8)")  # fmt: skip
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between readings")
    parser.add_argument("--max-minutes", type=float, default=60.0)
    parser.add_argument("--out", help="where the CSV and PNG go (default /tmp/prism-soak-TIME)")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument(
        "--without", metavar="PLUGIN", help="the full profile less this plugin (what it holds)"
    )
    parser.add_argument("--abort-client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.abort_client is not None:
        import uvloop

        uvloop.install()
        asyncio.run(abort_streams(args.abort_client, os.environ["SOAK_KEY"],
                                  args.abort_concurrency))  # fmt: skip
        return 0
    args.every = args.every or max(args.calls // 100, 1)
    wrk = find_wrk(False)
    if wrk is None:
        print("wrk not found (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    return in_scratch("soak", lambda work: soak(args, wrk, work))


if __name__ == "__main__":
    raise SystemExit(main())
