"""prism.service's sandbox and where the gateway writes agree.

systemd cannot run here, so the test builds what the unit's sandbox is: a
mount namespace (``unshare``) where the whole file system is mounted
read-only (``ProtectSystem=strict``) except the unit's ``StateDirectory=``,
its ``ReadWritePaths=`` and a private tmp (``PrivateTmp=``), with
``$STATE_DIRECTORY`` set as systemd sets it.  The unit's paths live under a
scratch root.  A read-only mount refuses root too, so unlike file permissions
it proves the point when the suite runs as root.  The gateway then runs the
unit's ``prism check`` and ``prism serve`` with the breaker and billing on their
default state paths, answers a call, and every file it made is under the state
directory.
"""

from __future__ import annotations

import asyncio
import configparser
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from prism_proxy.testing import free_port, serve_process

DEPLOY = Path(__file__).resolve().parents[1]

#: The sandbox: run as ``sh -c SANDBOX sandbox WRITABLE... -- COMMAND...`` in a
#: new mount namespace.
SANDBOX = r"""
set -e
while [ "$1" != -- ]; do mount --bind "$1" "$1"; shift; done
shift
mount -o remount,bind,ro /
exec "$@"
"""


def unit() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read(DEPLOY / "prism.service")
    return parser["Service"]


def can_sandbox() -> str | None:
    """Why no mount namespace can be made here, or None when one can."""
    try:
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        return "unshare (util-linux) is not installed"
    if probe.returncode != 0:
        return f"cannot make a mount namespace: {probe.stderr.strip()}"
    return None


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


async def test_the_gateway_writes_only_under_the_units_state_directory(
    tmp_path, prism_fake, prism_postgres
):
    service = unit()
    # The model below is ProtectSystem=strict's; another setting needs another model.
    assert service["ProtectSystem"] == "strict"
    assert service["PrivateTmp"] == "true"
    state_name = service["StateDirectory"]
    assert state_name == "prism"
    command = shlex.split(service["ExecStart"])
    config_path = Path(command[command.index("--config") + 1])
    assert command[1] == "serve"
    assert Path(service["WorkingDirectory"]) == Path("/var/lib") / state_name
    why = can_sandbox()
    if why is not None:
        pytest.skip(why)

    root = tmp_path / "root"

    def on_host(path: Path) -> Path:
        return root / path.relative_to("/")

    state = on_host(Path("/var/lib") / state_name)
    private_tmp = root / "tmp"
    config = on_host(config_path)
    writable = [state, private_tmp]
    writable += [on_host(Path(p)) for p in service.get("ReadWritePaths", "").split()]
    for directory in (*writable, config.parent):
        directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (config.parent / "catalog.toml").write_text(
        f'[providers.fake]\nkind = "openai"\nbase_url = "{prism_fake.base_url("ok")}"\n\n'
        '[models.chat]\nchain = [ { provider = "fake", model = "m", '
        "price = { input = 1.0, output = 2.0 } } ]\n"
    )
    # The breaker and billing (PostgreSQL ledger, so its spool) on their defaults.
    config.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n\n"
        f"[prism:billing]\nledger_url = {prism_postgres}\n"
    )
    shipped = files_under(root)
    env = {"STATE_DIRECTORY": str(state), "TMPDIR": str(private_tmp)}
    wrapper = ["unshare", "--mount", "--propagation", "private"]
    wrapper += ["sh", "-c", SANDBOX, "sandbox", *map(str, writable), "--"]

    check = subprocess.run(
        [*wrapper, sys.executable, "-m", "prism_proxy.cli", "check", "--config", str(config)],
        cwd=state,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    assert "breaker" in check.stdout and "billing" in check.stdout

    # The unit's serve command; one worker: `--workers auto` is one per CPU, and
    # more than one would need Redis for the breaker (it says so), which keeps
    # no state file at all: one worker is `auto` on a one-CPU host.
    args = command[command.index("--config") + 2 :]
    args[args.index("--workers") + 1] = "1"
    process = await serve_process(config, port, env=env, args=args, wrapper=wrapper, cwd=state)
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with session.post(url, json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]

    made = files_under(root) - shipped
    assert state / "prism-breaker.sqlite" in made
    assert all(path.is_relative_to(state) for path in made), sorted(map(str, made))
    assert files_under(config.parent) == {config, config.parent / "catalog.toml"}
