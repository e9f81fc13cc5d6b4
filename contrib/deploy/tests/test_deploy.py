"""The deployment files: the configuration they ship passes `prism check`, and the compose
file's three gateways serve, share state and bill (where a container engine runs)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

DEPLOY = Path(__file__).resolve().parents[1]
PORTS = (8401, 8402, 8403)


def test_the_shipped_configuration_passes_prism_check():
    result = subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", "check", "--config", str(DEPLOY / "prism.ini")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "redis" in result.stdout and "billing" in result.stdout


def test_the_systemd_unit_runs_one_worker_per_cpu_and_reloads_with_sighup():
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(DEPLOY / "prism.service")
    command = shlex.split(unit["Service"]["ExecStart"])
    assert command[1:3] == ["serve", "--config"]
    assert command[command.index("--workers") + 1] == "auto"
    assert unit["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert unit["Service"]["KillSignal"] == "SIGTERM"


def _engine() -> str | None:
    """Why the compose smoke test cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no container engine: docker is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        said = info.stderr.strip().splitlines() or ["no output"]
        return f"no container engine: docker info failed: {said[-1]}"
    compose = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    if compose.returncode != 0:
        return "no container engine: docker compose is not available"
    return None


def _compose(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _get(url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> dict:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict = orjson.loads(response.read())
        return data


def test_three_gateways_from_the_compose_file_serve_and_share_state():
    why = _engine()
    if why is not None:
        pytest.skip(why)
    up = _compose("up", "-d", "--build", "--wait")
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        made = _compose("exec", "-T", "gateway1", "prism", "keys", "create", "--org", "smoke",
                        "--scopes", "*", "--config", "/etc/prism/prism.ini")  # fmt: skip
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[-1]
        auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        chat = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
        deadline = time.monotonic() + 60
        for port in PORTS:
            while True:
                ready = _get(f"http://127.0.0.1:{port}/readyz")
                if ready.get("shared_state") == "ok" or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert ready["shared_state"] == "ok"
            answer = _get(f"http://127.0.0.1:{port}/v1/chat/completions", auth, chat)
            assert answer["choices"][0]["message"]["content"]
    finally:
        _compose("down", "-v", timeout=300)
