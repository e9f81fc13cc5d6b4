"""The bench's servers: starting, stopping and asking them (processes, HTTP, configs)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
BARE_PROXY = HERE / "bare_proxy.py"
HOST = "127.0.0.1"
MODEL = "bench"
READY_TIMEOUT_S = 20.0


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
