"""`prism serve --workers 2`: whichever worker a scrape reaches, the numbers add up."""

from __future__ import annotations

import asyncio
import collections
import os
import signal

import aiohttp

from prism_proxy.testing import free_port, installed_plugins, serve_process

from .conftest import MESSAGES, value

CALLS = 40


async def one_call(url: str) -> int:
    """A call on a fresh connection; the pid of the worker that served it."""
    connector = aiohttp.TCPConnector(force_close=False, limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url + "/readyz") as response:
            pid = int((await response.json())["pid"])
        payload = {"model": "m", "messages": MESSAGES}
        async with session.post(url + "/v1/chat/completions", json=payload) as response:
            assert response.status == 200
            await response.read()
    return pid


async def one_pid(url: str) -> int:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url + "/readyz") as response:
            return int((await response.json())["pid"])


async def scrape_fresh(url: str) -> str:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url + "/metrics") as response:
            return await response.text()


async def test_two_workers_counts_add_up_in_every_scrape_and_survive_a_killed_worker(
    prism_fake, tmp_path
):
    port = free_port()
    disable = ", ".join(sorted(set(installed_plugins()) - {"openai", "metrics"}))
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{prism_fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "up" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\nworkers = 2\n"
        f"shutdown_grace_s = 1\nlog_level = WARNING\ndisable = {disable}\n"
    )
    url = f"http://127.0.0.1:{port}"
    supervisor = await serve_process(ini, port, stderr=(tmp_path / "serve.log").open("ab"))
    try:
        # Both workers up (the port answers as soon as the first is), then the calls.
        for _ in range(200):
            if len({await one_pid(url) for _ in range(10)}) == 2:
                break
            await asyncio.sleep(0.05)
        served_by = collections.Counter([await one_call(url) for _ in range(CALLS)])
        assert len(served_by) == 2, served_by  # both workers served some of the calls

        # Each worker folds its counts into the shared files every quarter second.
        for _ in range(40):
            if value(await scrape_fresh(url), "prism_requests_total") == CALLS:
                break
            await asyncio.sleep(0.1)
        totals = {value(await scrape_fresh(url), "prism_requests_total") for _ in range(10)}
        assert totals == {CALLS}

        # A worker killed is restarted; what it counted still counts.
        victim = min(served_by)
        os.kill(victim, signal.SIGKILL)
        await asyncio.sleep(2.5)  # the supervisor restarts it after 1 s
        totals = {value(await scrape_fresh(url), "prism_requests_total") for _ in range(10)}
        assert totals == {CALLS}
        assert value(await scrape_fresh(url), "prism_inflight") == 0
    finally:
        supervisor.terminate()
        assert await asyncio.wait_for(supervisor.wait(), 15) == 0
