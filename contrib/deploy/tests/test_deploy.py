"""The deployment files: the configuration they ship passes `prism check`, the README's
commands work as written, and the compose file's three gateways serve, share state and
bill (where a container engine runs).

Without a container engine the compose gateways' configuration still runs here: the
same prism.ini and catalog.toml with compose.yaml's service names (redis, postgres,
upstream) pointed at this machine's Redis, PostgreSQL and a fake upstream, and the
image's environment (the Containerfile's ENV lines) mapped under a scratch root.
"""

from __future__ import annotations

import asyncio
import configparser
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import orjson
import pytest

from prism_proxy.testing import free_port, serve_process

DEPLOY = Path(__file__).resolve().parents[1]
PORTS = (8401, 8402, 8403)
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def readme_command(service: str) -> list[str]:
    """The command the README runs in ``service`` with ``docker compose ... exec``."""
    for line in (DEPLOY / "README.md").read_text().splitlines():
        if not line.startswith("docker compose "):
            continue
        words = shlex.split(line)
        if "exec" in words:
            at = words.index("exec")
            if words[at + 1] == service:
                return words[at + 2 :]
    raise AssertionError(f"the README runs nothing in {service}")


def image_environment() -> dict[str, str]:
    """What the Containerfile's ENV instructions set (``$PATH`` left unexpanded)."""
    text = (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["ENV"]:
            for word in words[1:]:
                name, _, value = word.partition("=")
                env[name] = value
    return env


def configparser_value(path: Path, section: str, key: str) -> str:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(path)
    return ini[section][key]


def on_host(root: Path, path: str) -> Path:
    return root / Path(path).relative_to("/")


def local_deployment(root: Path, fake_url: str, redis, postgres: str) -> tuple[Path, int]:
    """prism.ini and catalog.toml as the image sees them, compose's services made local."""
    config = on_host(root, image_environment()["PRISM_CONFIG"])
    config.parent.mkdir(parents=True)
    catalog = (DEPLOY / "catalog.toml").read_text()
    assert "http://upstream:18900/" in catalog
    (config.parent / "catalog.toml").write_text(catalog.replace("http://upstream:18900", fake_url))
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(DEPLOY / "prism.ini")
    port = free_port()
    assert ini["prism"]["listen"] == "0.0.0.0:8400"
    ini["prism"]["listen"] = f"127.0.0.1:{port}"
    assert ini["prism:redis"]["url"].startswith("redis://redis:6379/")
    ini["prism:redis"]["url"] = redis.url
    ini["prism:redis"]["key_prefix"] = redis.prefix
    for section, key in (("prism:billing", "ledger_url"), ("prism:keys", "db_url")):
        assert ini[section][key].startswith("postgresql://postgres@postgres:5432/")
        ini[section][key] = postgres
    with config.open("w") as out:
        ini.write(out)
    on_host(root, image_environment()["STATE_DIRECTORY"]).mkdir(parents=True)
    return config, port


def image_env(root: Path) -> dict[str, str]:
    """The process environment with the image's PRISM_CONFIG and STATE_DIRECTORY."""
    env = {key: value for key, value in os.environ.items() if key != "PRISM_CONFIG"}
    for name in ("PRISM_CONFIG", "STATE_DIRECTORY"):
        env[name] = str(on_host(root, image_environment()[name]))
    return env


async def every_worker_ready(url: str, workers: int, timeout_s: float = 30) -> None:
    """Until ``workers`` distinct processes have answered /readyz (serve_process waits
    for the first): a worker still starting when SIGTERM comes is not yet draining."""
    pids: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(pids) < workers:
        assert time.monotonic() < deadline, f"{len(pids)} of {workers} workers ready"
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(f"{url}/readyz") as response:
                if response.status == 200:
                    pids.add((await response.json())["pid"])
        await asyncio.sleep(0.02)


def prism(argv: list[str], root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``prism ...`` as the image runs it: its working directory, no --config added."""
    assert argv[0] == "prism"
    return subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", *argv[1:]],
        cwd=on_host(root, "/var/lib/prism"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_the_shipped_configuration_passes_prism_check_found_by_the_image(
    tmp_path, prism_fake, prism_redis, prism_postgres
):
    local_deployment(tmp_path, prism_fake.url, prism_redis, prism_postgres)
    result = prism(["prism", "check"], tmp_path, image_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "redis" in result.stdout and "billing" in result.stdout


async def test_the_readme_commands_work_as_written_with_the_shipped_configuration(
    tmp_path, prism_fake, prism_redis, prism_postgres
):
    config, port = local_deployment(tmp_path, prism_fake.url, prism_redis, prism_postgres)
    env = image_env(tmp_path)
    made = prism(readme_command("gateway1"), tmp_path, env)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    admin_token = secrets.token_hex(16)
    process = await serve_process(config, port, env={**env, "PRISM_ADMIN_TOKEN": admin_token})
    base = f"http://127.0.0.1:{port}"
    try:
        await every_worker_ready(base, int(configparser_value(config, "prism", "workers")))
        async with aiohttp.ClientSession() as session:
            chat = f"{base}/v1/chat/completions"
            bearer = {"Authorization": f"Bearer {key}"}
            async with session.post(chat, json=CHAT, headers=bearer) as answer:
                assert answer.status == 200, await answer.text()
                assert (await answer.json())["choices"][0]["message"]["content"]
            async with session.post(chat, json=CHAT) as refused:
                assert refused.status == 401
            reload = f"{base}/prism/admin/reload"
            admin = {"Authorization": f"Bearer {admin_token}"}
            async with session.post(reload, headers=admin) as reloaded:
                assert reloaded.status == 200, await reloaded.text()
            async with session.post(reload, headers=bearer) as not_admin:
                assert not_admin.status == 401
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()[-2000:]


def test_the_image_holds_every_plugin_and_needs_no_config_flag():
    text = (DEPLOY / "Containerfile").read_text()
    assert "./plugins/prism-*" in text
    plugins = [p for p in (DEPLOY.parents[1] / "plugins").iterdir() if p.name.startswith("prism-")]
    assert plugins and all((p / "pyproject.toml").is_file() for p in plugins)
    assert image_environment()["PRISM_CONFIG"] == "/etc/prism/prism.ini"
    assert "--config" not in text


def test_the_systemd_unit_runs_one_worker_per_cpu_and_reloads_with_sighup():
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(DEPLOY / "prism.service")
    command = shlex.split(unit["Service"]["ExecStart"])
    assert command[1:3] == ["serve", "--config"]
    assert command[command.index("--workers") + 1] == "auto"
    assert unit["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert unit["Service"]["KillSignal"] == "SIGTERM"


def test_the_deploy_files_name_only_files_that_exist():
    repo = DEPLOY.parents[1]
    for name in ("Containerfile", "compose.yaml", "prism.service", "prism.ini", "README.md"):
        text = (DEPLOY / name).read_text()
        for word in text.replace("`", " ").split():
            if word.startswith("tests/") and word.endswith(".py"):
                assert (DEPLOY / word).is_file(), (name, word)
            if word.startswith("contrib/") and word.rstrip(".,:;)").endswith(
                (".py", ".yaml", "Containerfile", ".md", ".ini", ".toml")
            ):
                assert (repo / word.rstrip(".,:;)")).is_file(), (name, word)


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


def _compose(
    *args: str, env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
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
    admin_token = secrets.token_hex(16)
    env = {**os.environ, "PRISM_ADMIN_TOKEN": admin_token}
    up = _compose("up", "-d", "--build", "--wait", env=env)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        made = _compose("exec", "-T", "gateway1", *readme_command("gateway1"), env=env)
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[-1]
        auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        deadline = time.monotonic() + 60
        for port in PORTS:
            while True:
                ready = _get(f"http://127.0.0.1:{port}/readyz")
                if ready.get("shared_state") == "ok" or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert ready["shared_state"] == "ok"
            answer = _get(f"http://127.0.0.1:{port}/v1/chat/completions", auth, orjson.dumps(CHAT))
            assert answer["choices"][0]["message"]["content"]
        admin = {"Authorization": f"Bearer {admin_token}"}
        assert _get(f"http://127.0.0.1:{PORTS[0]}/prism/admin/reload", admin, b"") is not None
    finally:
        _compose("down", "-v", env=env, timeout=300)
