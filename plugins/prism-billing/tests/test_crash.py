"""SIGKILL the real `prism serve` process mid-traffic: no delivered answer lacks its row."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prism_fake_upstream import Fault

from prism_proxy.testing import free_port, serve_process

from .conftest import ADMIN_ENV, ADMIN_TOKEN

CALLS = 50
KILL_AFTER = 15  # complete answers before the kill: the rest are mid-flight
MESSAGES = [{"role": "user", "content": "hello there"}]


async def start_prism(tmp_path: Path, fake: Any, port: int) -> asyncio.subprocess.Process:
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
        f"admin_token_env = {ADMIN_ENV}\nlog_level = WARNING\n\n"
        "[prism:billing]\nledger_path = ledger.sqlite\n"
    )
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{fake.base_url("crash")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "x", '
        "price = { input = 3.0, output = 15.0 } } ]\n"
    )
    return await serve_process(
        tmp_path / "prism.ini",
        port,
        env={ADMIN_ENV: ADMIN_TOKEN},
        stderr=(tmp_path / "stderr.log").open("ab"),
    )


async def one_call(
    session: aiohttp.ClientSession, url: str, stream: bool
) -> tuple[str | None, bool]:
    """(request id, whether the whole answer arrived)."""
    request_id = None
    try:
        async with session.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": stream},
        ) as response:
            request_id = response.headers.get("x-prism-request-id")
            body = await response.read()
            if response.status != 200:
                return request_id, False
            if stream:
                return request_id, body.endswith(b"data: [DONE]\n\n")
            answer = orjson.loads(body)
            return request_id, bool(answer["choices"][0]["message"]["content"])
    except (aiohttp.ClientError, orjson.JSONDecodeError):
        return request_id, False


async def test_sigkill_mid_traffic_loses_no_delivered_answer(prism_fake, tmp_path):
    # Answers from 0.1 s to 2.5 s long, half streamed, so the kill lands mid-flight.
    prism_fake.script(
        "crash",
        [Fault(token_delay_s=0.05, text=" ".join(["w"] * (2 + i))) for i in range(CALLS)],
    )
    port = free_port()
    process = await start_prism(tmp_path, prism_fake, port)
    url = f"http://127.0.0.1:{port}"
    complete = 0
    enough = asyncio.Event()

    async def tracked(session: aiohttp.ClientSession, i: int) -> tuple[str | None, bool]:
        nonlocal complete
        result = await one_call(session, url, stream=i % 2 == 0)
        if result[1]:
            complete += 1
            if complete >= KILL_AFTER:
                enough.set()
        return result

    connector = aiohttp.TCPConnector(limit=CALLS)
    async with aiohttp.ClientSession(connector=connector) as session:
        calls = [asyncio.create_task(tracked(session, i)) for i in range(CALLS)]
        async with asyncio.timeout(30):
            await enough.wait()
        process.kill()
        results = await asyncio.gather(*calls)
    assert await asyncio.wait_for(process.wait(), 10) == -9

    delivered = [rid for rid, ok in results if ok]
    assert delivered and all(delivered)
    assert len(delivered) < CALLS, "the kill should have cut some calls short"

    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    try:
        rows = conn.execute("SELECT request_id, outcome, cost_nanos FROM ledger").fetchall()
    finally:
        conn.close()
    by_id: dict[str, list[tuple[str, int]]] = {}
    for request_id, outcome, cost in rows:
        by_id.setdefault(request_id, []).append((outcome, cost))
    for request_id in delivered:
        assert len(by_id.get(request_id, [])) == 1, f"{request_id} delivered without one row"
        outcome, cost = by_id[request_id][0]
        assert outcome == "ok" and cost > 0

    # The restarted gateway opens the same ledger and reports what survived.
    process = await start_prism(tmp_path, prism_fake, port)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(
                url + "/prism/usage?group_by=",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            ) as response:
                assert response.status == 200
                total = (await response.json())["total"]
        assert total["calls"] == len(rows) >= len(delivered)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)
