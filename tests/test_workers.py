"""`prism serve --workers N`: N processes on one port, restarted when they die, drained together."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp

from prism_proxy.testing import free_port, installed_plugins, serve_process

HI = [{"role": "user", "content": "hi"}]


def write_config(tmp_path: Path, fake, port: int, workers: int, disable_breaker: bool) -> Path:
    # Only what the test needs: installed plugins beyond openai are left out.
    keep = {"openai"} | (set() if disable_breaker else {"breaker"})
    disable = sorted(set(installed_plugins()) - keep)
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "up" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
        f"workers = {workers}\nshutdown_grace_s = 2\n"
        + (f"disable = {', '.join(disable)}\n" if disable else "")
    )
    return ini


async def ready_pids(url: str, tries: int = 60) -> dict[int, int]:
    """pid -> generation of the workers answering /readyz (a new connection each time)."""
    seen: dict[int, int] = {}
    for _ in range(tries):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            try:
                async with s.get(url + "/readyz") as response:
                    if response.status == 200:
                        body = await response.json()
                        seen[body["pid"]] = body["generation"]
            except aiohttp.ClientConnectionError:
                pass
    return seen


async def until(predicate, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


async def test_workers_share_the_port_restart_reload_and_drain(prism_fake, tmp_path):
    port = free_port()
    ini = write_config(tmp_path, prism_fake, port, workers=2, disable_breaker=True)
    supervisor = await serve_process(ini, port, stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:

        async def both_up() -> bool:
            return len(await ready_pids(url, 20)) == 2

        await until(both_up)
        first = set(await ready_pids(url))
        assert len(first) == 2 and supervisor.pid not in first

        # A worker that dies is replaced; the port keeps answering meanwhile.
        victim = min(first)
        os.kill(victim, signal.SIGKILL)

        async def replaced() -> bool:
            pids = set(await ready_pids(url, 20))
            return len(pids) == 2 and victim not in pids

        await until(replaced)

        # SIGHUP reloads every worker.
        supervisor.send_signal(signal.SIGHUP)

        async def reloaded() -> bool:
            gens = await ready_pids(url, 20)
            return len(gens) == 2 and set(gens.values()) == {2}

        await until(reloaded)
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": HI}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
        workers = set(await ready_pids(url))
    finally:
        supervisor.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(supervisor.communicate(), 30)
    assert supervisor.returncode == 0
    text = stderr.decode()
    assert f"(pid {victim}) exited" in text and "restarting in" in text
    for pid in workers:  # drained with the supervisor
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )


async def serve_refused(ini: Path, *extra: str) -> tuple[int | None, str]:
    """``prism serve`` that must stop at start-up: its exit status and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prism_proxy.cli",
        "serve",
        "--config",
        str(ini),
        *extra,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode, stderr.decode()


async def test_workers_refuse_a_breaker_that_keeps_state_in_one_process(prism_fake, tmp_path):
    port = free_port()
    ini = write_config(tmp_path, prism_fake, port, workers=2, disable_breaker=False)
    status, message = await serve_refused(ini)
    assert status == 2
    assert "[prism] workers" in message and "prism-breaker keeps each binding's health" in message
    assert "Traceback" not in message


async def test_a_bad_worker_count_is_one_line(prism_fake, tmp_path):
    port = free_port()
    ini = write_config(tmp_path, prism_fake, port, workers=1, disable_breaker=True)
    status, message = await serve_refused(ini, "--workers", "many")
    assert status == 2
    assert message.strip().endswith("expected a number of workers or auto, got 'many'")
