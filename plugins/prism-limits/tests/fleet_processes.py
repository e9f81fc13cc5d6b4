"""A fleet of real ``prism serve`` processes for the crash tests of prism-limits.

Every gateway is its own process on its own free port, started from its own
configuration file in one directory, and they share what a real fleet
shares: one Redis key prefix, one PostgreSQL ledger and one SQLite keys
database made with the ``prism keys`` command.  A gateway is crashed with
SIGKILL (by its process id) and started again from the same file, on the same
port, as a supervisor would.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import attrs
import orjson

from prism_proxy.cli import main as prism_main
from prism_proxy.testing import free_port, installed_plugins, serve_process

__all__ = [
    "Fleet",
    "Gateway",
    "budget_remaining",
    "ledger_by_org",
    "limits_show",
    "nanos",
    "running_fleet",
]

#: The plugins a gateway of this fleet loads; every other installed one is disabled.
PLUGINS = ("openai", "keys", "limits", "billing", "redis")
#: Per million tokens, as the limits tests' catalog prices its line.
PRICE_INPUT = "1.0"
PRICE_OUTPUT = "2.0"


@attrs.define
class Gateway:
    """One ``prism serve`` process of the fleet (None while it is down)."""

    number: int
    port: int
    config: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.returncode is None


@attrs.define
class Fleet:
    """Gateways sharing one Redis prefix, one PostgreSQL ledger and one keys database."""

    workdir: Path
    gateways: list[Gateway] = attrs.field(factory=list)

    @property
    def first_config(self) -> Path:
        return self.gateways[0].config

    def keys(self, *args: str) -> str:
        """``prism keys ARGS --config <a gateway's file>``: its output; fails unless it exits 0."""
        return cli(self.first_config, "keys", *args)

    def create_key(self, org: str) -> str:
        out = self.keys("create", "--org", org, "--scopes", "*")
        return out.rstrip("\n").splitlines()[-1]  # the key, alone on the last line

    async def start(self, gateway: Gateway) -> None:
        log = (self.workdir / f"gateway{gateway.number}.log").open("ab")
        try:
            # Generous: several processes start at once on a loaded test machine.
            gateway.process = await serve_process(
                gateway.config, gateway.port, stderr=log, timeout_s=60
            )
        finally:
            log.close()  # the child holds its own copy of the descriptor

    async def start_all(self) -> None:
        await asyncio.gather(*(self.start(gateway) for gateway in self.gateways))

    async def kill(self, gateway: Gateway) -> None:
        """SIGKILL: the process ends at once, settling nothing and giving nothing back.

        The gateway counts as down from the moment the signal is sent."""
        process = gateway.process
        assert process is not None and process.returncode is None
        gateway.process = None
        os.kill(process.pid, signal.SIGKILL)
        assert await asyncio.wait_for(process.wait(), 10) == -signal.SIGKILL

    async def stop_all(self) -> None:
        for gateway in self.gateways:
            process = gateway.process
            if process is not None and process.returncode is None:
                os.kill(process.pid, signal.SIGTERM)
        for gateway in self.gateways:
            process = gateway.process
            if process is None or process.returncode is not None:
                continue
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                os.kill(process.pid, signal.SIGKILL)
                await process.wait()


def write_configs(
    workdir: Path,
    fake_url: str,
    redis_url: str,
    redis_prefix: str,
    ledger_url: str,
    count: int,
    limits: Mapping[str, str],
) -> Fleet:
    """The catalog and one configuration file per gateway, all in ``workdir``."""
    (workdir / "catalog.toml").write_text(
        f'[providers.a]\nkind = "openai"\nbase_url = "{fake_url}"\n'
        '[models.m]\nretries = 0\nchain = [ { provider = "a", model = "up", '
        f"price = {{ input = {PRICE_INPUT}, output = {PRICE_OUTPUT} }} }} ]\n"
    )
    disable = ", ".join(sorted(set(installed_plugins()) - set(PLUGINS)))
    limit_lines = "".join(f"{name} = {value}\n" for name, value in limits.items())
    fleet = Fleet(workdir)
    for number in range(count):
        port = free_port()
        config = workdir / f"gateway{number}.ini"
        config.write_text(
            f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
            f"log_level = WARNING\nshutdown_grace_s = 1\ndisable = {disable}\n"
            "[prism:keys]\ndb_path = keys.db\n"
            # Generous timeout: a loaded test machine must not look like a Redis outage.
            f"[prism:redis]\nurl = {redis_url}\nkey_prefix = {redis_prefix}\n"
            "timeout_ms = 5000\n"
            # No spool: a row is in the ledger when its answer is, or the call is refused.
            f"[prism:billing]\nledger_url = {ledger_url}\nspool_path = off\n"
            f"[prism:limits]\n{limit_lines}"
        )
        fleet.gateways.append(Gateway(number, port, config))
    return fleet


@contextlib.asynccontextmanager
async def running_fleet(fleet: Fleet) -> AsyncIterator[Fleet]:
    """The fleet started (all at once); every process still running is stopped after."""
    try:
        await fleet.start_all()
        yield fleet
    finally:
        await fleet.stop_all()


def cli(config: Path, *args: str) -> str:
    """The ``prism`` command line, run in this process (it is synchronous for ``keys``)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = prism_main([*args, "--config", str(config)])
    assert status == 0, f"prism {' '.join(args[:2])}: exit {status}: {err.getvalue()}"
    return out.getvalue()


async def limits_show(config: Path, org: str) -> tuple[int, dict[str, Any] | None, str]:
    """``prism limits show ORG --org --json`` as its own process (it runs its own event
    loop): the exit status, the JSON it printed (None if none), and what it said on stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prism_proxy.cli", "limits", "show", org, "--org", "--json",
        "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    shown = orjson.loads(out) if process.returncode == 0 and out.strip() else None
    return process.returncode, shown, err.decode()


async def budget_remaining(session: aiohttp.ClientSession, url: str, key: str) -> Decimal:
    """What ``GET /prism/me`` tells a key of an organisation remains of its budget."""
    me = await prism_me(session, url, key)
    found = [
        entry
        for entry in me["limits"]
        if entry["scope"] == "organisation" and entry["limit"] == "budget"
    ]
    assert len(found) == 1, me
    return Decimal(found[0]["remaining"])


async def prism_me(session: aiohttp.ClientSession, url: str, key: str) -> dict[str, Any]:
    async with session.get(
        url + "/prism/me", headers={"Authorization": f"Bearer {key}"}
    ) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


async def ledger_by_org(ledger_url: str) -> dict[str, tuple[int, int]]:
    """Each organisation's ledger total (nano-units) and row count, for the customer calls
    a line served."""
    conn = await asyncpg.connect(ledger_url, timeout=10)
    try:
        rows: Sequence[Any] = await conn.fetch(
            "SELECT org, COALESCE(SUM(cost_nanos), 0) AS spent, COUNT(*) AS n FROM ledger "
            "WHERE traffic = 'customer' AND provider IS NOT NULL GROUP BY org"
        )
    finally:
        await conn.close()
    return {str(row["org"]): (int(row["spent"]), int(row["n"])) for row in rows}


def nanos(amount: Decimal | str) -> int:
    """An amount in the catalog's currency as nano-units (exact)."""
    return int(Decimal(amount).scaleb(9))
