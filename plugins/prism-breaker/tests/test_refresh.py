"""The background refresher keeps the state file open: it works when file handles run out.

An attack that holds thousands of slow connections can use up every file
handle the process may have.  Overrides written by ``prism breaker ...`` (its
own process) must still reach the gateway then, and its own writes must land.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from prism_breaker import Observation, breaker_of

from prism_proxy import Outcome
from prism_proxy.cli import main as prism_main
from prism_proxy.testing import out_of_file_handles


def write_config(tmp_path: Path, fake: Any) -> Path:
    (tmp_path / "catalog.toml").write_text(
        f'[providers.a]\nkind = "openai"\nbase_url = "{fake.base_url("a")}"\n'
        f'[providers.b]\nkind = "openai"\nbase_url = "{fake.base_url("b")}"\n'
        '[models.m]\nchain = [{ provider = "a", model = "up-a" }, '
        '{ provider = "b", model = "up-b" }]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        "[prism]\ncatalog = catalog.toml\n[prism:breaker]\nstate_path = breaker.sqlite\n"
    )
    return ini


async def cli(capsys: pytest.CaptureFixture[str], ini: Path, *args: str) -> str:
    """``prism breaker ...``, standing for the operator's own process."""
    capsys.readouterr()
    code = await asyncio.to_thread(prism_main, ["breaker", *args, "--config", str(ini)])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


async def test_overrides_and_state_still_refresh_when_the_process_is_out_of_file_handles(
    prism_fake, prism_gateway, kit, fake_time, tmp_path, capsys, caplog
):
    ini = write_config(tmp_path, prism_fake)
    gw = await prism_gateway(
        kit.catalog("a", "b"),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        # The periodic refresh stays out of the way: the test refreshes when it means to.
        sections={"breaker": {"state_path": str(tmp_path / "breaker.sqlite"), "refresh_s": 300}},
    )
    breaker = breaker_of(gw.gateway.current)
    await breaker.refresh()
    quarantine = await cli(capsys, ini, "quarantine", "--binding", "a/up-a", "--reason", "leak")
    cap = await cli(
        capsys, ini, "cap", "--binding", "b/up-b", "--max-in-flight", "1", "--expires", "1h",
        "--reason", "slow down",
    )  # fmt: skip
    quarantine_id, cap_id = quarantine.split()[0], cap.split()[0]
    assert not breaker.overrides.active

    with out_of_file_handles():
        await breaker.refresh()
        assert set(breaker.overrides.active) == {quarantine_id, cap_id}
        fake_time.advance(2 * 3600)
        await breaker.refresh()  # ends the expired cap: a write
        assert set(breaker.overrides.active) == {quarantine_id}
        now = fake_time.now
        revision = breaker.machine.get("b/up-b", now).revision
        observed = Observation(Outcome.PERMANENT, revision, reason="marker: invalid_api_key")
        breaker.machine.observe("b/up-b", observed, now)
        await breaker.flush()  # the isolation: a write
        assert breaker.last_store_error is None
    assert "state store failed" not in caplog.text

    listing = orjson.loads(await cli(capsys, ini, "list", "--json"))
    assert [o["id"] for o in listing["overrides"]] == [quarantine_id]
    states = {b["binding"]: b["state"] for b in listing["bindings"]}
    assert states == {"a/up-a": "eligible", "b/up-b": "isolated"}
    audit = await cli(capsys, ini, "audit", "--binding", "b/up-b")
    assert f"b/up-b  expire {cap_id}  by breaker: cap expired" in audit


class FailingReads:
    """The real store, whose next few reads of the overrides fail."""

    def __init__(self, store: Any, failures: int) -> None:
        self.store = store
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def active_overrides(self) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise sqlite3.OperationalError("unable to open database file")
        return await self.store.active_overrides()


async def test_a_change_a_failed_refresh_missed_is_picked_up_by_the_next(
    prism_fake, prism_gateway, kit, tmp_path, capsys
):
    ini = write_config(tmp_path, prism_fake)
    gw = await prism_gateway(
        kit.catalog("a", "b"),
        sections={"breaker": {"state_path": str(tmp_path / "breaker.sqlite"), "refresh_s": 300}},
    )
    breaker = breaker_of(gw.gateway.current)
    await breaker.refresh()
    breaker.store = FailingReads(breaker.store, failures=1)
    quarantine = await cli(capsys, ini, "quarantine", "--binding", "a/up-a", "--reason", "leak")

    with pytest.raises(sqlite3.OperationalError):
        await breaker.refresh()
    assert not breaker.overrides.active  # the last good state stays
    await breaker.refresh()
    assert set(breaker.overrides.active) == {quarantine.split()[0]}
    assert (await kit.chat(gw)).provider == "b"
