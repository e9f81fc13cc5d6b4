"""`prism check` reaches the PostgreSQL and Redis a configuration names, read-only, and says
whether billing, keys and shared state are on: the real command against real servers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis

from prism_proxy.testing import free_port

CATALOG = (
    '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
    '[models.m]\nchain = [ { provider = "p", model = "x", '
    "price = { input = 1.0, output = 2.0 } } ]\n"
)


def write_ini(directory: Path, *, postgres: str, redis: str, prefix: str) -> Path:
    (directory / "catalog.toml").write_text(CATALOG)
    ini = directory / "prism.ini"
    ini.write_text(
        "[prism]\ncatalog = catalog.toml\n"
        f"[prism:billing]\nledger_url = {postgres}\n"
        f"[prism:keys]\ndb_url = {postgres}\n"
        f"[prism:redis]\nurl = {redis}\nkey_prefix = {prefix}\n"
    )
    return ini


async def prism(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prism_proxy.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def line(out: str, subject: str) -> str:
    (found,) = [text for text in out.splitlines() if text.startswith(f"{subject}: ")]
    return found


async def test_check_reaches_postgresql_and_redis_and_writes_nothing(
    tmp_path, prism_postgres, prism_redis
):
    ini = write_ini(
        tmp_path, postgres=prism_postgres, redis=prism_redis.url, prefix=prism_redis.prefix
    )
    status, out, err = await prism("check", "--config", str(ini))
    assert status == 0, out + err
    assert line(out, "billing") == (
        f"billing: on, ledger {prism_postgres}: reachable, no ledger table yet "
        "(prism serve creates it)"
    )
    assert line(out, "keys") == (
        f"keys: on, API keys required, from {prism_postgres}: reachable, no key table yet: "
        "every call is refused (401) until `prism keys create`"
    )
    assert line(out, "shared state") == (
        f"shared state: on, Redis {prism_redis.url} (prefix {prism_redis.prefix}): reachable"
    )
    assert line(out, "services") == (
        "services: capacity: redis, telemetry: metrics, breaker-store: redis, "
        "breaker: breaker, shared-state: redis, pricing: billing, spend: billing, "
        "principals: keys, key-admin: keys, usage: billing, response-store: responses, "
        "overrides: breaker, limits: limits"
    )
    # Read-only: no table in the database, no key in Redis.
    conn = await asyncpg.connect(prism_postgres)
    try:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', "
            "'information_schema')"
        )
    finally:
        await conn.close()
    assert tables == []
    client = aioredis.Redis.from_url(prism_redis.url)
    try:
        assert [key async for key in client.scan_iter(match=f"{prism_redis.prefix}:*")] == []
    finally:
        await client.aclose()

    # Once a key exists, the check counts it.
    status, _, err = await prism(
        "keys", "create", "--config", str(ini), "--org", "acme", "--scopes", "*"
    )
    assert status == 0, err
    status, out, err = await prism("check", "--config", str(ini))
    assert status == 0, out + err
    assert line(out, "keys").endswith(f"from {prism_postgres}: reachable, 1 active key")


async def test_what_does_not_answer_fails_the_check_without_its_password(tmp_path):
    postgres = f"postgresql://prism:s3cret-pg@127.0.0.1:{free_port()}/prism"
    redis = f"redis://:s3cret-redis@127.0.0.1:{free_port()}/0"
    ini = write_ini(tmp_path, postgres=postgres, redis=redis, prefix="nowhere")
    status, out, err = await prism("check", "--config", str(ini))
    assert status == 1, out + err
    shown = postgres.replace("s3cret-pg", "***")
    assert line(out, "billing").startswith(
        f"billing: on, ledger {shown}: NOT REACHABLE (ConnectionRefusedError"
    )
    assert line(out, "keys").startswith(
        f"keys: on, API keys required, from {shown}: NOT REACHABLE (ConnectionRefusedError"
    )
    assert line(out, "shared state").startswith(
        f"shared state: on, Redis {redis.replace('s3cret-redis', '***')} (prefix nowhere): "
        "NOT REACHABLE (ConnectionError"
    )
    assert err.endswith(
        "prism check: the configuration is valid, but not ready: billing, keys, shared state\n"
    )
    assert "s3cret" not in out + err

    # --offline validates without contacting anything.
    status, out, err = await prism("check", "--config", str(ini), "--offline")
    assert status == 0, out + err
    assert line(out, "billing") == f"billing: on, ledger {shown}: not contacted (--offline)"
    assert line(out, "keys").endswith(f"from {shown}: not contacted (--offline)")
    assert line(out, "shared state").endswith("(prefix nowhere): not contacted (--offline)")
    assert "s3cret" not in out + err
