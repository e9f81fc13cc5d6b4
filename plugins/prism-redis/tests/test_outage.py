"""Redis dies mid-run: every call is still served, /readyz says so, and the fleet converges."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import free_port, installed_plugins, serve_process

from .conftest import (
    MESSAGES,
    binding_state,
    breaker_audit,
    chat,
    get_json,
    two_line_catalog,
    until,
)


async def shared_state(url: str) -> str:
    return str((await get_json(url, "/readyz"))["shared_state"])


async def test_a_dead_redis_degrades_serving_never_stops_and_state_converges(
    prism_fake, fleet, private_redis, caplog
):
    await private_redis.started()
    a, b = await fleet(2, two_line_catalog(prism_fake), url=private_redis.url)
    assert [await shared_state(gw.url) for gw in (a, b)] == ["ok", "ok"]

    private_redis.kill()
    started = time.monotonic()
    answers = await asyncio.gather(*(chat(gw.url) for gw in (a, b) for _ in range(5)))
    assert [x.status for x in answers] == [200] * 10
    assert time.monotonic() - started < 5  # nothing waits on the dead Redis

    async def degraded() -> bool:
        return [await shared_state(gw.url) for gw in (a, b)] == ["degraded", "degraded"]

    await until(degraded, timeout_s=5)
    readyz = await get_json(a.url, "/readyz")
    assert readyz["status"] == "ready" and readyz["redis"]["outages"] == 1
    assert (await get_json(a.url, "/prism/stats"))["counters"]["redis_outages"] == 1
    assert readyz["redis"]["where"].startswith("redis://:***@127.0.0.1")
    assert private_redis.password not in str(readyz)

    # While Redis is away, A trips x on its own evidence; B cannot know yet.
    prism_fake.script("x", [Fault(status=500)] * 3)
    for _ in range(3):
        assert (await chat(a.url)).status == 200
    assert await binding_state(a.url, "x/up-x") == "isolated"
    assert await binding_state(b.url, "x/up-x") == "eligible"

    # Redis comes back empty (it keeps nothing on disk): A's state reaches B.
    await private_redis.started()

    async def converged() -> bool:
        ok = [await shared_state(gw.url) for gw in (a, b)] == ["ok", "ok"]
        return ok and await binding_state(b.url, "x/up-x") == "isolated"

    await until(converged, timeout_s=10)
    answer = await chat(b.url)
    assert answer.provider == "ok" and "x/up-x skipped breaker: isolated" in answer.log
    assert "does not answer" in caplog.text and "answers again" in caplog.text
    assert private_redis.password not in caplog.text


async def test_a_gateway_starts_while_redis_is_down_and_joins_when_it_answers(
    prism_fake, fleet, private_redis
):
    (a,) = await fleet(1, two_line_catalog(prism_fake), url=private_redis.url)
    assert await shared_state(a.url) == "degraded"
    assert (await chat(a.url)).status == 200
    await private_redis.started()

    async def joined() -> bool:
        return await shared_state(a.url) == "ok"

    await until(joined, timeout_s=10)


async def test_a_write_whose_answer_was_lost_is_not_held_against_the_next_one(
    prism_fake, fleet, private_redis, prism_redis
):
    await private_redis.started()
    a, b = await fleet(
        2, two_line_catalog(prism_fake), url=private_redis.url, redis={"timeout_ms": 100}
    )
    prism_fake.script("x", [Fault(status=500)] * 3)
    await chat(a.url)  # one failure: still eligible
    # Redis stalls: A's write of "suspect" waits in Redis's socket, A gives up on its answer.
    private_redis.pause()
    try:
        await chat(a.url)

        async def a_degraded() -> bool:
            return await shared_state(a.url) == "degraded"

        await until(a_degraded, timeout_s=5)
        await chat(a.url)  # the third failure isolates x, while A still thinks its write failed
        assert await binding_state(a.url, "x/up-x") == "isolated"
    finally:
        private_redis.resume()  # Redis now applies that write; A sends it again with the next

    async def isolated_everywhere() -> bool:
        return [await binding_state(gw.url, "x/up-x") for gw in (a, b)] == ["isolated"] * 2

    await until(isolated_everywhere, timeout_s=10)
    health = await get_json(b.url, "/prism/health")
    entry = next(e for e in health["bindings"] if e["binding"] == "x/up-x")
    assert entry["revision"] == 2
    rows = await breaker_audit(private_redis, prism_redis.prefix)
    assert [(r["subject"], r["revision"]) for r in rows] == [("x/up-x", 2), ("x/up-x", 1)]


async def test_a_lease_whose_answer_was_lost_does_not_keep_the_slot_from_the_fleet(
    prism_fake, fleet, private_redis
):
    await private_redis.started()
    catalog = two_line_catalog(prism_fake, max_concurrency=1)
    a, b = await fleet(2, catalog, url=private_redis.url, redis={"timeout_ms": 100})
    private_redis.pause()
    try:
        # A asks Redis for x's one slot; the lease waits in Redis's socket, A gives up
        # on the answer and counts the call locally.
        assert (await chat(a.url)).provider == "x"
    finally:
        private_redis.resume()  # Redis now grants that lease, to nobody (lease_s: 60 s)

    async def both_ok() -> bool:
        return [await shared_state(gw.url) for gw in (a, b)] == ["ok", "ok"]

    await until(both_ok, timeout_s=10)

    async def b_gets_the_slot() -> bool:
        return (await chat(b.url)).provider == "x"

    await until(b_gets_the_slot, timeout_s=5)


def serve_ini(tmp_path: Path, fake: Any, port: int, redis_url: str, extra: str = "") -> Path:
    """``prism serve`` with the breaker on ``redis_url``; model ``m``: x, then ok."""
    plugins = {"openai", "breaker", "redis", "probes"}
    disable = ", ".join(sorted(set(installed_plugins()) - plugins))
    (tmp_path / "catalog.toml").write_text(
        "".join(
            f'[providers.{name}]\nkind = "openai"\nbase_url = "{fake.base_url(name)}"\n'
            for name in ("x", "ok")
        )
        + '[models.m]\nretries = 0\nchain = [ { provider = "x", model = "up-x" }, '
        '{ provider = "ok", model = "up-ok" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\ndisable = {disable}\n"
        f"{extra}"
        "[prism:breaker]\npolicies = consecutive\nconsecutive_failures = 1\nrefresh_s = 0.2\n"
        f"[prism:redis]\nurl = {redis_url}\nsync_s = 0.1\ntimeout_ms = 200\n"
    )
    return ini


async def test_sigterm_with_redis_down_drains_and_says_once_what_was_not_shared(
    prism_fake, tmp_path
):
    port = free_port()
    # Nothing listens at the Redis URL: Redis is down from the start to the end.
    redis_url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    ini = serve_ini(tmp_path, prism_fake, port, redis_url, "shutdown_grace_s = 5\n")
    log = tmp_path / "serve.log"
    process = await serve_process(ini, port, stderr=log.open("ab"))
    try:
        prism_fake.script("x", [Fault(status=500)])
        answer = await chat(f"http://127.0.0.1:{port}")  # isolates x: a change Redis never gets
        assert answer.status == 200 and answer.provider == "ok"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = log.read_text()
    final = [line for line in text.splitlines() if "final state" in line]
    assert len(final) == 1 and " WARNING prism.breaker: " in final[0], final
    assert "could not be shared" in final[0] and "changes not written: 1" in final[0]
    assert "Traceback" not in text and "hunter2-secret" not in text


async def test_workers_with_probes_and_redis_down_each_drain_within_the_grace(prism_fake, tmp_path):
    port, grace = free_port(), 3
    redis_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: Redis is down
    extra = (
        f"workers = 2\nshutdown_grace_s = {grace}\n"
        "[prism:probes]\nenabled = true\ninterval_s = 0.2\n"
    )
    ini = serve_ini(tmp_path, prism_fake, port, redis_url, extra)
    log = tmp_path / "serve.log"
    supervisor = await serve_process(ini, port, stderr=log.open("ab"))
    url, pids = f"http://127.0.0.1:{port}", set()

    async def both_workers_serve() -> bool:
        connector = aiohttp.TCPConnector(force_close=True)  # each ask may reach either
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(url + "/readyz") as response:
                pids.add((await response.json())["pid"])
        return len(pids) == 2

    await until(both_workers_serve)
    # x answers everyone, probes too, after a long while: a call in flight at SIGTERM
    # outlasts the grace, and the worker serving it must cut it off at the grace.
    prism_fake.script("x", [Fault(stall_s=60)] * 100)
    stuck = asyncio.ensure_future(chat(url))
    try:

        async def customer_in_flight() -> bool:
            return any(r.body["messages"] == MESSAGES for r in prism_fake.requests("x"))

        await until(customer_in_flight)
        stopped_at = time.monotonic()
        supervisor.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(supervisor.wait(), grace + 15) == 0
        took = time.monotonic() - stopped_at
        with pytest.raises(aiohttp.ClientError):
            await stuck  # cut off at the grace
    finally:
        if supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()
        stuck.cancel()
    text = log.read_text()
    assert "did not stop in time" not in text and "while draining" not in text
    # The grace, and cleaning up (aiohttp alone took twice the grace).
    assert took < 2 * grace - 0.5, took
    assert text.count("INFO prism: stopped") == 2 and "Traceback" not in text
    assert "busy connections closed: " in text  # the call outliving the grace, cut off
