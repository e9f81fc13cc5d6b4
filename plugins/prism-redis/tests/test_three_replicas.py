"""Three `prism serve` processes sharing Redis and PostgreSQL, like replicas behind a balancer."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from prism_fake_upstream import Fault
from prism_redis.testing import RedisUnderTest

from prism_proxy.testing import free_port, installed_plugins, serve_process

from .conftest import binding_state, chat, until

MODELS = ("x", "e", "t", "q")  # one scenario each, so the checks do not disturb each other
BREAKER = (
    "[prism:breaker]\npolicies = consecutive, error_rate\nconsecutive_failures = 3\n"
    "error_rate = 0.25\nerror_rate_min_calls = 12\nisolation_s = 2\n"
    "trial_spacing_s = 30\ntrial_min_successes = 3\nrefresh_s = 0.5\n"
)


def write_catalog(tmp_path: Path, fake: Any) -> None:
    providers = "".join(
        f'[providers.{n}]\nkind = "openai"\nbase_url = "{fake.base_url(n)}"\n'
        for n in (*MODELS, "ok")
    )
    models = "".join(
        f'[models.m{n}]\nretries = 0\nchain = [ {{ provider = "{n}", model = "up-{n}", '
        "price = { input = 3.0, output = 15.0 } }, "
        '{ provider = "ok", model = "up-ok", price = { input = 1.0, output = 2.0 } } ]\n'
        for n in MODELS
    )
    (tmp_path / "catalog.toml").write_text(providers + models)


@contextlib.asynccontextmanager
async def replicas(
    tmp_path: Path, fake: Any, redis: RedisUnderTest, pg_url: str, n: int = 3
) -> AsyncIterator[list[tuple[asyncio.subprocess.Process, str]]]:
    write_catalog(tmp_path, fake)
    keep = {"openai", "breaker", "billing", "redis"}
    disable = ", ".join(sorted(set(installed_plugins()) - keep))
    started: list[tuple[asyncio.subprocess.Process, str]] = []
    try:
        for i in range(n):
            port = free_port()
            ini = tmp_path / f"replica{i}.ini"
            ini.write_text(
                f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
                f"log_level = WARNING\nshutdown_grace_s = 1\ndisable = {disable}\n"
                f"[prism:redis]\nurl = {redis.url}\nkey_prefix = {redis.prefix}\nsync_s = 0.1\n"
                f"[prism:billing]\nledger_url = {pg_url}\n" + BREAKER
            )
            log = (tmp_path / f"replica{i}.log").open("ab")
            process = await serve_process(ini, port, stderr=log)
            started.append((process, f"http://127.0.0.1:{port}"))
        yield started
    finally:
        for process, _ in started:
            if process.returncode is None:
                process.terminate()
        for process, _ in started:
            await asyncio.wait_for(process.wait(), 15)


async def test_three_replicas_share_one_view_of_every_binding(
    prism_fake, prism_redis, prism_postgres, tmp_path
):
    async with replicas(tmp_path, prism_fake, prism_redis, prism_postgres) as fleet:
        urls = [url for _, url in fleet]
        one, others = urls[0], urls[1:]

        # A binding tripped through one replica is skipped by the other two within 1 s.
        prism_fake.script("x", [Fault(status=500)] * 3)
        for _ in range(3):
            assert (await chat(one, "mx")).provider == "ok"

        async def others_skip_x() -> bool:
            return [await binding_state(url, "x/up-x") for url in others] == ["isolated"] * 2

        assert await until(others_skip_x, timeout_s=5) < 1.0
        hits = prism_fake.hits("x")
        for url in others:
            assert "x/up-x skipped breaker: isolated" in (await chat(url, "mx")).log
        assert prism_fake.hits("x") == hits

        # The error-rate trip sees the whole fleet's traffic: 12 calls, 4 per replica.
        prism_fake.script("e", [Fault(status=500), Fault()] * 6)
        for i in range(12):
            await chat(urls[i % 3], "me")

        async def e_isolated() -> bool:
            return {await binding_state(url, "e/up-e") for url in urls} == {"isolated"}

        await until(e_isolated, timeout_s=5)

        # One trial for the fleet: 30 concurrent calls over three replicas, one upstream call.
        prism_fake.script("t", [Fault(status=500)] * 3)
        for _ in range(3):
            await chat(one, "mt")

        async def t_in_trial() -> bool:
            return {await binding_state(url, "t/up-t") for url in urls} == {"trial"}

        await until(t_in_trial, timeout_s=10)
        hits = prism_fake.hits("t")
        answers = await asyncio.gather(*(chat(urls[i % 3], "mt") for i in range(30)))
        assert [a.status for a in answers] == [200] * 30
        assert prism_fake.hits("t") == hits + 1
        assert sum(a.provider == "t" for a in answers) == 1

        # A quarantine set with the CLI is honoured by all three.
        ini = tmp_path / "replica0.ini"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prism_proxy.cli", "breaker", "quarantine",
            "--config", str(ini), "--binding", "q/up-q", "--reason", "vendor incident",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        override_id = out.decode().split()[0]

        async def all_quarantine() -> bool:
            logs = [(await chat(url, "mq")).log for url in urls]
            return all(f"q/up-q skipped breaker: quarantined ({override_id})" in x for x in logs)

        await until(all_quarantine, timeout_s=5)
        assert prism_fake.hits("q") == 0


async def test_sigkill_one_of_three_replicas_loses_and_duplicates_no_row(
    prism_fake, prism_redis, prism_postgres, tmp_path
):
    calls, kill_after = 50, 15
    prism_fake.script(
        "x", [Fault(token_delay_s=0.05, text=" ".join(["w"] * (2 + i % 40))) for i in range(calls)]
    )
    async with replicas(tmp_path, prism_fake, prism_redis, prism_postgres) as fleet:
        victim = fleet[1][0]
        complete = 0
        enough = asyncio.Event()

        async def one(session: aiohttp.ClientSession, i: int) -> tuple[str | None, bool]:
            nonlocal complete
            url = fleet[i % 3][1]
            stream = i % 2 == 0
            request_id = None
            try:
                async with session.post(
                    url + "/v1/chat/completions",
                    json={"model": "mx", "messages": [{"role": "user", "content": "hi"}],
                          "stream": stream},
                ) as response:  # fmt: skip
                    request_id = response.headers.get("x-prism-request-id")
                    body = await response.read()
                    ok = response.status == 200 and (
                        body.endswith(b"data: [DONE]\n\n")
                        if stream
                        else bool(orjson.loads(body)["choices"][0]["message"]["content"])
                    )
            except (aiohttp.ClientError, orjson.JSONDecodeError):
                ok = False
            if ok:
                complete += 1
                if complete >= kill_after:
                    enough.set()
            return request_id, ok

        connector = aiohttp.TCPConnector(limit=calls)
        async with aiohttp.ClientSession(connector=connector) as session:
            tasks = [asyncio.create_task(one(session, i)) for i in range(calls)]
            async with asyncio.timeout(30):
                await enough.wait()
            victim.kill()
            results = await asyncio.gather(*tasks)
        assert await asyncio.wait_for(victim.wait(), 10) == -9

    delivered = [rid for rid, ok in results if ok]
    assert delivered and all(delivered)
    assert len(delivered) < calls, "the kill should have cut some calls short"
    conn = await asyncpg.connect(prism_postgres, timeout=5)
    try:
        rows = await conn.fetch("SELECT request_id, outcome FROM ledger")
    finally:
        await conn.close()
    by_id: dict[str, list[str]] = {}
    for row in rows:
        by_id.setdefault(row["request_id"], []).append(row["outcome"])
    assert all(len(outcomes) == 1 for outcomes in by_id.values()), "a duplicated row"
    missing = [rid for rid in delivered if by_id.get(rid) != ["ok"]]
    assert missing == [], f"{len(missing)} delivered answers without their row"
