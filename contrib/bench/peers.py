"""Peer gateways for the benchmark: Portkey's gateway and the LiteLLM proxy.

``running_peers`` installs them if needed, starts each on a free 127.0.0.1
port in front of the bench's fake upstream, checks that one plain and one
streamed chat completion really go through, and yields one ``Peer`` each:
the URL and headers to point wrk at (``post.lua`` sends the headers from
``BENCH_HEADERS``), the server's pid (its CPU, children included, is read
from /proc by the caller) or, when something went wrong, why (``failure``).
A peer that fails is reported, never dropped.

They are installed into a cache directory of their own, never into the
project's environment (default ``~/.cache/prism-bench-peers``):

- ``litellm-venv/``: a virtualenv with ``litellm[proxy]`` (about 750 MB on disk);
- ``portkey/``: ``npm install --prefix`` of ``@portkey-ai/gateway`` (about 25 MB).

An existing install of the same pinned versions is reused. Each peer runs as
its documentation recommends for production, one process, logging off:

- LiteLLM: ``litellm --config config.yaml --num_workers 1`` with a model
  ``bench`` mapped to ``openai/bench`` at the fake's base URL, a master key
  (sent as ``Authorization: Bearer``), no database, spend and error logs off,
  ``LITELLM_LOG=ERROR`` and the bundled model cost map
  (``LITELLM_LOCAL_MODEL_COST_MAP``: otherwise it fetches one from GitHub);
- Portkey: its Node server (``build/start-server.js --port=N --headless``,
  ``NODE_ENV=production``), the upstream named per request by the headers
  ``x-portkey-provider: openai`` and ``x-portkey-custom-host: <base URL>``.
  Its stream handler sleeps 25 ms before passing on an OpenAI stream's first
  event: a floor under its streamed latency that costs no CPU.

Servers get the environment without proxy variables; only 127.0.0.1 is
contacted (the package registries too while installing).

    python contrib/bench/peers.py [--duration 3] [--warmup 1] [--cache-dir DIR]
                                  [--peer litellm] [--no-reference]

runs the fake upstream, the peers and, for reference, Prism and the bare
proxy, and prints requests/s and CPU per request of each under
``wrk -t2 -c16``, non-streaming and streaming.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import run
from run import HOST, MODEL, Server, chat_body, free_port, http_request, spawn, wait_ready

PEER_NAMES = ("portkey", "litellm")

#: Pinned, so that a cached install is reused and two runs measure the same code.
#: Later litellm[proxy] releases (1.108.8 on) also need a ``litellm-proxy`` package
#: of the same version, which the index did not offer when this was written: pip then
#: walks back release by release (40 MB each) to this one.
LITELLM_SPEC = "litellm[proxy]==1.108.7"
PORTKEY_SPEC = (
    "@portkey-ai/gateway@1.15.2",
    # The gateway appends headers to the upstream's Response; from @hono/node-server
    # 1.14.3 on those are immutable and every streamed answer fails with "TypeError:
    # immutable" (Portkey-AI/gateway#1389). 1.13.5 is what the gateway's own lockfile
    # has; @hono/node-ws 1.2.0 is the last release whose peer range allows it.
    "@hono/node-server@1.13.5",
    "@hono/node-ws@1.2.0",
)
LITELLM_MASTER_KEY = "sk-prism-bench-peers"
#: What Portkey forwards as the upstream's key (the fake ignores it).
UPSTREAM_KEY = "sk-prism-bench-upstream"
READY_TIMEOUT_S = {"portkey": 60.0, "litellm": 120.0}
INSTALL_TIMEOUT_S = {"portkey": 900.0, "litellm": 3600.0}
PROBE_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0
MARKER = ".prism-bench-installed"

#: Node's listen() without a host takes every interface, and start-server.js passes
#: none: this preload (``node --require``) makes such a call listen on 127.0.0.1.
LOOPBACK_SHIM = """\
// Written by contrib/bench/peers.py: keep Portkey's server on 127.0.0.1.
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" && (args[1] === undefined || typeof args[1] === "function")) {
    if (args[1] === undefined) args[1] = "127.0.0.1"; else args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
"""


@dataclass(frozen=True)
class Peer:
    name: str  # "portkey" | "litellm"
    url: str  # full chat-completions URL to point wrk at
    headers: dict[str, str]  # extra request headers wrk must send (post.lua: BENCH_HEADERS)
    pid: int | None  # the server process (its CPU and its children's are the peer's)
    failure: str | None  # why it could not be installed/started/probed (then url may be "")

    @property
    def ok(self) -> bool:
        return self.failure is None

    def bench_headers(self) -> str:
        """``headers`` as post.lua's ``BENCH_HEADERS``: one ``Name: value`` per line."""
        return "\n".join(f"{name}: {value}" for name, value in self.headers.items())


class PeerError(Exception):
    """A peer could not be installed, started or probed; the message says why."""


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "prism-bench-peers"


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- installing


def _size_mb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_blocks * 512  # on disk, as du
    return total / 1e6


def _run_logged(argv: Sequence[str], log_path: Path, label: str, timeout_s: float) -> None:
    """Run an installer, its output to ``log_path`` and, line by line, to stderr."""
    log(f"{label}: {' '.join(argv)}")
    with log_path.open("a") as log_file:
        log_file.write(f"$ {' '.join(argv)}\n")
        log_file.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        tail: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log_file.write(line)
                print(f"  [{label}] {line.rstrip()}", file=sys.stderr, flush=True)
                tail = [*tail[-39:], line.rstrip()]
            code = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if code != 0:
        why = f"timed out after {timeout_s:.0f} s" if timed_out.is_set() else f"exited with {code}"
        errors = [line for line in tail if line.lstrip().lower().startswith(("error", "npm err"))]
        raise PeerError(f"{argv[0]} {why} (log: {log_path}): " + " | ".join((errors or tail)[-5:]))


@contextlib.contextmanager
def _install_lock(cache: Path) -> Iterator[None]:
    """One installer at a time per cache directory (two benches may start at once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _installed(directory: Path, spec: str, entry: Path) -> bool:
    marker = directory / MARKER
    try:
        return entry.exists() and marker.read_text() == spec
    except OSError:
        return False


def _finish_install(name: str, directory: Path, spec: str, started: float) -> None:
    (directory / MARKER).write_text(spec)
    log(
        f"{name}: installed {spec!r} in {time.monotonic() - started:.0f} s, "
        f"{_size_mb(directory):.0f} MB in {directory}"
    )


def portkey_entry(cache: Path) -> Path:
    return (
        cache / "portkey" / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    )


def litellm_entry(cache: Path) -> Path:
    return cache / "litellm-venv" / "bin" / "litellm"


def install_portkey(cache: Path) -> Path:
    """``npm install --prefix <cache>/portkey`` (if not done yet); the server's script."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise PeerError("Portkey's gateway needs Node.js and npm, and they are not on PATH")
    directory, entry, spec = cache / "portkey", portkey_entry(cache), " ".join(PORTKEY_SPEC)
    with _install_lock(cache):
        if _installed(directory, spec, entry):
            return entry
        log(f"portkey: installing {spec} into {directory} (takes a minute)")
        started = time.monotonic()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / MARKER).unlink(missing_ok=True)
        # --ignore-scripts: the only script is the gateway's postinstall, patch-package,
        # and the published package has no patches for it.
        npm_argv = [npm, "install", "--prefix", str(directory), "--no-audit", "--no-fund"]
        npm_argv += ["--ignore-scripts", *PORTKEY_SPEC]
        log_path = cache / "portkey-install.log"
        _run_logged(npm_argv, log_path, "npm", INSTALL_TIMEOUT_S["portkey"])
        if not entry.exists():
            raise PeerError(f"npm install finished but {entry} is missing")
        _finish_install("portkey", directory, spec, started)
    return entry


def install_litellm(cache: Path) -> Path:
    """A virtualenv ``<cache>/litellm-venv`` with ``litellm[proxy]`` (if not done yet)."""
    directory, entry = cache / "litellm-venv", litellm_entry(cache)
    with _install_lock(cache):
        if _installed(directory, LITELLM_SPEC, entry):
            return entry
        log(f"litellm: installing {LITELLM_SPEC} into {directory} (takes a few minutes)")
        started = time.monotonic()
        (directory / MARKER).unlink(missing_ok=True)
        python = shutil.which("python3") or sys.executable
        install_log = cache / "litellm-install.log"
        _run_logged([python, "-m", "venv", str(directory)], install_log, "venv", 300.0)
        pip = [str(directory / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off"]
        _run_logged([*pip, LITELLM_SPEC], install_log, "pip", INSTALL_TIMEOUT_S["litellm"])
        if not entry.exists():
            raise PeerError(f"pip install finished but {entry} is missing")
        _finish_install("litellm", directory, LITELLM_SPEC, started)
    return entry


def installed_version(name: str, cache_dir: Path | None = None) -> str | None:
    """The version of peer ``name`` installed in the cache, or None."""
    cache = cache_dir or default_cache_dir()
    try:
        if name == "portkey":
            package = portkey_entry(cache).parent.parent / "package.json"
            version = json.loads(package.read_text())["version"]
            return str(version)
        if name == "litellm":
            site = cache / "litellm-venv" / "lib"
            found = sorted(site.glob("python*/site-packages/litellm-[0-9]*.dist-info"))
            return found[-1].name[len("litellm-") : -len(".dist-info")] if found else None
    except (OSError, ValueError, KeyError):
        return None
    raise ValueError(f"unknown peer {name!r} (known: {', '.join(PEER_NAMES)})")


# --------------------------------------------------------------------------- running


def server_env(extra: Mapping[str, str]) -> dict[str, str]:
    """Prism's servers' environment (no proxies), without a database for LiteLLM."""
    env = run.server_env()
    # LiteLLM connects to a DATABASE_URL it finds (the bench runs it without one).
    for var in ("DATABASE_URL", "DIRECT_URL", "LITELLM_MASTER_KEY", "STORE_MODEL_IN_DB"):
        env.pop(var, None)
    env.update(extra)
    return env


def _spawn(name: str, argv: Sequence[str], cwd: Path, env: dict[str, str]) -> Server:
    return spawn(name, argv, cwd, cwd / f"{name}.log", env)


def _stop(started: Sequence[Server]) -> None:
    """SIGTERM to each process group, then SIGKILL to what is left after a grace period."""
    for server in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for server in started:
        try:
            server.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # The group too: a worker may outlive its leader.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.proc.pid, signal.SIGKILL)
        if server.proc.poll() is None:
            server.proc.wait()


def _wait_ready(server: Server, port: int, path: str, timeout_s: float) -> None:
    try:
        wait_ready(server, port, path, timeout_s)
    except RuntimeError as exc:
        raise PeerError(f"{exc}\n(log {server.log_path})") from None


def probe(port: int, path: str, headers: Mapping[str, str]) -> str | None:
    """One plain and one streamed request through the peer; what is wrong, or None."""
    problems = []
    for stream in (False, True):
        kind = "stream" if stream else "non-stream"
        try:
            status, body = http_request(
                port, "POST", path, chat_body(stream), PROBE_TIMEOUT_S, list(headers.items())
            )
        except OSError as exc:
            problems.append(f"{kind}: {exc}")
            continue
        if status != 200:
            problems.append(f"{kind}: HTTP {status} {body[:300]!r}")
        elif stream and (b"[DONE]" not in body or b" upstream" not in body):
            # The fake streams "Hello from bench. This is the fake upstream answering."
            # one word per event, then [DONE].
            problems.append(f"{kind}: not the fake's stream: {body[-300:]!r}")
        elif not stream and (b'"choices"' not in body or b"fake upstream" not in body):
            problems.append(f"{kind}: not the fake's answer: {body[:300]!r}")
    return "; ".join(problems) or None


def _start_portkey(
    entry: Path, upstream_base: str, workdir: Path
) -> tuple[Server, int, dict[str, str]]:
    port = free_port()
    shim = workdir / "loopback.cjs"
    shim.write_text(LOOPBACK_SHIM)
    node = shutil.which("node") or "node"
    server = _spawn(
        "portkey",
        [node, "--require", str(shim), str(entry), f"--port={port}", "--headless"],
        workdir,
        server_env({"NODE_ENV": "production"}),
    )
    headers = {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": upstream_base,
        "Authorization": f"Bearer {UPSTREAM_KEY}",
    }
    return server, port, headers


def write_litellm_config(directory: Path, upstream_base: str) -> Path:
    config = directory / "config.yaml"
    # JSON is YAML: no quoting questions for the URL.
    model = {"model": f"openai/{MODEL}", "api_base": upstream_base, "api_key": UPSTREAM_KEY}
    config.write_text(
        "model_list:\n"
        f"  - model_name: {json.dumps(MODEL)}\n"
        f"    litellm_params: {json.dumps(model)}\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
        "  request_timeout: 600\n"
        "general_settings:\n"
        f"  master_key: {json.dumps(LITELLM_MASTER_KEY)}\n"
        "  disable_spend_logs: true\n"
        "  disable_error_logs: true\n"
    )
    return config


def _start_litellm(
    entry: Path, upstream_base: str, workdir: Path
) -> tuple[Server, int, dict[str, str]]:
    port = free_port()
    config = write_litellm_config(workdir, upstream_base)
    server = _spawn(
        "litellm",
        [
            str(entry),
            "--config",
            str(config),
            "--host",
            HOST,
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        workdir,
        server_env(
            {
                "LITELLM_LOG": "ERROR",
                # Production mode: no .env file read from the working directory.
                "LITELLM_MODE": "PRODUCTION",
                # The cost map bundled with the package, not one fetched from GitHub.
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "PYTHONUNBUFFERED": "1",
            }
        ),
    )
    return server, port, {"Authorization": f"Bearer {LITELLM_MASTER_KEY}"}


_INSTALL = {"portkey": install_portkey, "litellm": install_litellm}
_START = {"portkey": _start_portkey, "litellm": _start_litellm}
_READY_PATH = {"portkey": "/", "litellm": "/health/liveliness"}


@contextlib.contextmanager
def running_peers(
    upstream_base: str,
    scratch: Path,
    names: Sequence[str] = PEER_NAMES,
    cache_dir: Path | None = None,
) -> Iterator[list[Peer]]:
    """Install (if needed), start and probe each peer in ``names``; stop them all on exit.

    ``upstream_base`` is the fake's OpenAI base URL (``http://127.0.0.1:PORT/s/ok/v1``);
    ``scratch`` gets each peer's working directory, configuration and log. Every
    name yields a ``Peer``, in order: a failing one with ``failure`` set.
    """
    unknown = [name for name in names if name not in _START]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)} (known: {', '.join(PEER_NAMES)})")
    names = list(dict.fromkeys(names))  # each peer once
    cache = (cache_dir or default_cache_dir()).expanduser()
    started: list[Server] = []
    peers: list[Peer] = []
    try:
        # Start every peer first, then wait for them: LiteLLM's start takes a while.
        pending: list[tuple[str, Server, int, dict[str, str]]] = []
        failures: dict[str, str] = {}
        for name in names:
            try:
                entry = _INSTALL[name](cache)
                workdir = scratch / f"peer-{name}"
                workdir.mkdir(parents=True, exist_ok=True)
                server, port, headers = _START[name](entry, upstream_base, workdir)
            except (PeerError, OSError, subprocess.SubprocessError) as exc:
                failures[name] = f"{name}: {exc}"
                log(failures[name])
                continue
            started.append(server)
            pending.append((name, server, port, headers))
        ready: dict[str, Peer] = {}
        for name, server, port, headers in pending:
            path = "/v1/chat/completions"
            try:
                _wait_ready(server, port, _READY_PATH[name], READY_TIMEOUT_S[name])
                took = time.monotonic() - server.started_at
                log(f"{name}: ready on {HOST}:{port} {took:.1f} s after its start")
                problem = probe(port, path, headers)
            except PeerError as exc:
                problem = str(exc)
            if problem is not None:
                failures[name] = f"{name}: {problem}"
                log(f"{failures[name]}\n{server.log_tail()}")
            ready[name] = Peer(
                name=name,
                url=f"http://{HOST}:{port}{path}",
                headers=headers,
                pid=server.proc.pid if server.proc.poll() is None else None,
                failure=failures.get(name),
            )
        for name in names:
            peer = ready.get(name)
            if peer is None:
                peer = Peer(name=name, url="", headers={}, pid=None, failure=failures[name])
            peers.append(peer)
        yield peers
    finally:
        _stop(started)


# --------------------------------------------------------------------------- demo


@dataclass(frozen=True)
class _Cell:
    requests: int
    rps: float
    cpu_us: float
    errors: int
    failure: str | None = None


def _wrk(url: str, headers: Mapping[str, str], stream: bool, seconds: int, pid: int) -> _Cell:
    """wrk -t2 -c16 with post.lua; the CPU the server's process tree spent per request."""
    from proc import cpu_seconds

    env = server_env(
        {
            "BENCH_STREAM": "1" if stream else "0",
            "BENCH_MODEL": MODEL,
            "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items()),
        }
    )
    script = Path(__file__).resolve().parent / "post.lua"
    argv = ["wrk", "-t2", "-c16", f"-d{seconds}s", "--timeout", "10s", "-s", str(script), url]
    before = cpu_seconds(pid)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60)
    spent = cpu_seconds(pid) - before
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            data = json.loads(line.removeprefix("BENCH_JSON "))
            served = int(data["requests"])
            return _Cell(
                requests=served,
                rps=float(data["rps"]),
                cpu_us=spent / max(served, 1) * 1e6,
                errors=sum(int(v) for v in data["errors"].values()),
            )
    output = (done.stderr or done.stdout).strip()[-300:]
    return _Cell(0, 0.0, 0.0, 0, failure=f"wrk exit {done.returncode}: {output}")


@dataclass(frozen=True)
class _Target:
    name: str
    url: str
    headers: dict[str, str]
    pid: int | None
    failure: str | None


def _references(scratch: Path, upstream_base: str, started: list[Server]) -> list[_Target]:
    """The bare proxy and ``prism serve``, as run.py starts them, to compare with."""
    from run import write_prism_config

    bin_dir = Path(sys.executable).parent
    bare_port, prism_port = free_port(), free_port()
    bare = [sys.executable, str(Path(__file__).resolve().parent / "bare_proxy.py")]
    bare += ["--port", str(bare_port), "--upstream", upstream_base]
    ini = write_prism_config(scratch, prism_port, upstream_base)
    prism = [str(bin_dir / "prism"), "serve", "--config", str(ini)]
    targets = []
    for name, argv, port, ready in (
        ("bare-proxy", bare, bare_port, "/healthz"),
        ("prism", prism, prism_port, "/readyz"),
    ):
        server = _spawn(name, argv, scratch, server_env({}))
        started.append(server)
        try:
            _wait_ready(server, port, ready, 20.0)
            failure = probe(port, "/v1/chat/completions", {})
        except PeerError as exc:
            failure = str(exc)
        url = f"http://{HOST}:{port}/v1/chat/completions"
        targets.append(_Target(name, url, {}, server.proc.pid, failure))
    return targets


def _demo(
    duration: int, warmup: int, names: Sequence[str], cache_dir: Path | None, reference: bool
) -> int:
    import tempfile

    if shutil.which("wrk") is None:
        log("wrk is not installed (apt-get install -y wrk)")
        return 2
    with tempfile.TemporaryDirectory(prefix="prism-peers-") as tmp:
        scratch = Path(tmp)
        up_port = free_port()
        upstream_base = f"http://{HOST}:{up_port}/s/ok/v1"
        fake_argv = run.fake_upstream_argv(up_port)
        started = [_spawn("fake-upstream", fake_argv, scratch, server_env({}))]
        try:
            _wait_ready(started[0], up_port, "/s/ok/v1/models", 20.0)
            targets = _references(scratch, upstream_base, started) if reference else []
            with running_peers(upstream_base, scratch, names, cache_dir) as peers:
                targets += [_Target(p.name, p.url, p.headers, p.pid, p.failure) for p in peers]
                print(
                    f"wrk -t2 -c16 -d{duration}s (after {warmup} s of warm-up), post.lua; "
                    "CPU: the server's process tree, from /proc"
                )
                for stream in (False, True):
                    kind = "stream    " if stream else "non-stream"
                    prism_cpu = 0.0
                    for target in targets:
                        if target.failure is not None or target.pid is None:
                            print(f"{kind} {target.name:10} FAILED: {target.failure}")
                            continue
                        if warmup > 0:
                            _wrk(target.url, target.headers, stream, warmup, target.pid)
                        cell = _wrk(target.url, target.headers, stream, duration, target.pid)
                        if cell.failure is not None:
                            print(f"{kind} {target.name:10} wrk FAILED: {cell.failure}")
                            continue
                        if target.name == "prism":
                            prism_cpu = cell.cpu_us
                        ratio = f"  {cell.cpu_us / prism_cpu:5.1f}x prism" if prism_cpu else ""
                        errors = f"  ({cell.errors} ERRORS)" if cell.errors else ""
                        print(
                            f"{kind} {target.name:10} {cell.requests:6d} requests "
                            f"{cell.rps:7.0f}/s {cell.cpu_us:7.0f} us CPU each{ratio}{errors}",
                            flush=True,
                        )
                for peer in peers:
                    print(f"{peer.name}: {installed_version(peer.name, cache_dir) or '-'}")
        finally:
            _stop(started)
    return 0


def _cli(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=3, help="seconds of wrk per cell")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of wrk before each cell")
    parser.add_argument("--cache-dir", type=Path, help="where the peers are installed")
    parser.add_argument("--peer", action="append", choices=PEER_NAMES, help="only this one")
    parser.add_argument(
        "--no-reference", action="store_true", help="do not also measure Prism and the bare proxy"
    )
    args = parser.parse_args(argv)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # so that every server started is stopped

    signal.signal(signal.SIGTERM, stop)
    names = args.peer or PEER_NAMES
    return _demo(args.duration, args.warmup, names, args.cache_dir, not args.no_reference)


if __name__ == "__main__":
    sys.exit(_cli())
