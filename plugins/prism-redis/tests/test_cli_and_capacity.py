"""Operator overrides through the CLI, and line capacity, across gateways sharing Redis."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
from prism_fake_upstream import Fault
from prism_redis.testing import RedisUnderTest

from .conftest import chat, get_json, two_line_catalog, until


async def prism_cli(ini: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prism_proxy.cli",
        *args,
        "--config",
        str(ini),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def write_ini(tmp_path: Path, fake: Any, redis: RedisUnderTest) -> Path:
    (tmp_path / "catalog.toml").write_text(
        "".join(
            f'[providers.{n}]\nkind = "openai"\nbase_url = "{fake.base_url(n)}"\n'
            for n in ("x", "ok")
        )
        + '[models.m]\nchain = [ { provider = "x", model = "up-x" }, '
        '{ provider = "ok", model = "up-ok" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        "[prism]\ncatalog = catalog.toml\n"
        f"[prism:redis]\nurl = {redis.url}\nkey_prefix = {redis.prefix}\n"
    )
    return ini


async def test_a_quarantine_set_with_the_cli_is_honoured_by_every_gateway(
    prism_fake, fleet, prism_redis, tmp_path
):
    gateways = await fleet(3, two_line_catalog(prism_fake))
    ini = write_ini(tmp_path, prism_fake, prism_redis)
    status, out, err = await prism_cli(
        ini, "breaker", "quarantine", "--binding", "x/up-x", "--reason", "bad answers"
    )
    assert status == 0, err
    override_id = out.split()[0]

    async def everyone_quarantines() -> bool:
        logs = [(await chat(gw.url)).log for gw in gateways]
        return all(f"skipped breaker: quarantined ({override_id})" in log for log in logs)

    await until(everyone_quarantines, timeout_s=5)
    status, out, _ = await prism_cli(ini, "breaker", "list", "--json")
    assert status == 0
    listed = orjson.loads(out)
    assert [o["id"] for o in listed["overrides"]] == [override_id]

    # Released with the CLI: every gateway routes to x again; the audit has both.
    status, _, err = await prism_cli(ini, "breaker", "release", override_id, "--reason", "fixed")
    assert status == 0, err

    async def everyone_uses_x() -> bool:
        return all([(await chat(gw.url)).provider == "x" for gw in gateways])

    await until(everyone_uses_x, timeout_s=5)
    status, out, _ = await prism_cli(ini, "breaker", "audit", "--json")
    actions = [entry["action"] for entry in orjson.loads(out)]
    assert actions == ["release", "quarantine"]


async def test_max_concurrency_holds_across_the_fleet(prism_fake, fleet):
    # Two slots on x for the whole fleet: six slow calls over three gateways.
    catalog = two_line_catalog(prism_fake, max_concurrency=2)
    gateways = await fleet(3, catalog)
    prism_fake.script("x", [Fault(stall_s=1.0)] * 6)
    answers = await asyncio.gather(*(chat(gateways[i % 3].url) for i in range(6)))
    assert all(a.status == 200 for a in answers)
    served_by = sorted(str(a.provider) for a in answers)
    assert served_by == ["ok", "ok", "ok", "ok", "x", "x"]
    full = [a for a in answers if "x/up-x skipped full (2 in flight)" in a.log]
    assert len(full) == 4

    # The slots came back: x serves again on every gateway.
    for gw in gateways:
        assert (await chat(gw.url)).provider == "x"


async def test_a_queued_call_gets_a_slot_another_gateway_gave_back(prism_fake, fleet):
    catalog = two_line_catalog(prism_fake, max_concurrency=1, queue_ms=3000)
    a, b = await fleet(2, catalog)
    prism_fake.script("x", [Fault(stall_s=0.5), Fault()])
    first = asyncio.create_task(chat(a.url))
    await until(lambda: _hits(prism_fake, "x", 1))
    second = await chat(b.url)  # waits for a's slot, then takes x
    assert second.provider == "x"
    assert (await first).provider == "x"


async def _hits(fake: Any, scenario: str, n: int) -> bool:
    return bool(fake.hits(scenario) >= n)


async def test_an_ordinary_call_makes_no_redis_round_trip_and_a_limited_line_one(prism_fake, fleet):
    catalog = two_line_catalog(prism_fake)
    catalog["models"]["limited"] = {
        "chain": [{"provider": "ok", "model": "up-ok", "max_concurrency": 4}]
    }
    (gw,) = await fleet(1, catalog)
    background = {"ping", "breaker_poll", "breaker_exchange", "breaker_read"}
    for _ in range(20):
        assert (await chat(gw.url)).status == 200
    trips = (await get_json(gw.url, "/readyz"))["redis"]["round_trips"]
    assert set(trips) <= background, trips

    for _ in range(10):
        assert (await chat(gw.url, "limited")).status == 200

    async def released() -> bool:
        trips = (await get_json(gw.url, "/readyz"))["redis"]["round_trips"]
        return trips.get("capacity_release") == 10

    await until(released, timeout_s=5)
    trips = (await get_json(gw.url, "/readyz"))["redis"]["round_trips"]
    assert trips["capacity_lease"] == 10
