"""`prism limits show` and `prism limits rebase`, and what `prism check` says of limits.

Each test runs a real gateway in this process and the command line against
the same configuration written to a file, as an operator would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from prism_limits.plugin import limiter_of

from prism_proxy import SERVICES
from prism_proxy.cli import main
from prism_proxy.testing import installed_plugins

from .conftest import PRICE, catalog, ledger_nanos

HI = [{"role": "user", "content": "hi"}]
PLUGINS = ["openai", "limits", "billing", "redis"]


def catalog_toml(fake: Any) -> str:
    return (
        f'[providers.a]\nkind = "openai"\nbase_url = "{fake.base_url("a")}"\n'
        '[models.m]\nretries = 0\nchain = [{ provider = "a", model = "up", '
        f"price = {{ input = {PRICE['input']}, output = {PRICE['output']} }} }}]\n"
    )


async def setup(
    prism_gateway: Any,
    fake: Any,
    tmp_path: Path,
    sections: dict[str, dict[str, Any]],
    plugins: list[str] = PLUGINS,
) -> tuple[Any, Path]:
    """A gateway on ``sections``, and the same configuration as a file for the CLI."""
    (tmp_path / "catalog.toml").write_text(catalog_toml(fake))
    disable = ", ".join(sorted(set(installed_plugins()) - set(plugins)))
    text = f"[prism]\ncatalog = catalog.toml\ndisable = {disable}\n"
    for name, values in sections.items():
        text += f"[prism:{name}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
    ini = tmp_path / "prism.ini"
    ini.write_text(text)
    gw = await prism_gateway(
        catalog(fake),  # what catalog.toml says
        sections=sections,
        base_dir=tmp_path,
        load_plugins=plugins,
    )
    return gw, ini


async def run(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    # The command runs its own event loop: off this test's.
    status = await asyncio.to_thread(main, [*args, "--config", str(ini)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


async def chat(gw: Any, **body: Any) -> Any:
    async with gw.openai() as client:
        return await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, **body
        )


async def settled(gw: Any) -> None:
    limiter = limiter_of(gw.gateway.current)
    assert limiter is not None
    if limiter.fleet is not None:
        await limiter.fleet.settled()


def fleet_sections(prism_redis: Any, **limits: Any) -> dict[str, dict[str, Any]]:
    return {
        "billing": {"ledger_path": "ledger.sqlite"},
        "redis": {"url": prism_redis.url, "key_prefix": prism_redis.prefix, "timeout_ms": 5000},
        "limits": limits,
    }


#: The anonymous callers' total budget, as its counter is named in Redis.
ANONYMOUS_TOTAL = "limits:default:anonymous:*:budget:0"


async def test_rebase_repairs_a_budget_counter_that_drifted_from_the_ledger(
    prism_gateway, prism_fake, prism_redis, tmp_path, capsys
):
    gw, ini = await setup(
        prism_gateway, prism_fake, tmp_path, fleet_sections(prism_redis, budget="1/total")
    )
    for _ in range(3):
        await chat(gw, max_tokens=5)
    await settled(gw)
    spent = ledger_nanos(tmp_path / "ledger.sqlite")
    assert spent > 0
    client = aioredis.Redis.from_url(prism_redis.url, decode_responses=True)
    key = f"{prism_redis.prefix}:{ANONYMOUS_TOTAL}"
    try:
        assert int(await client.hget(key, "spent")) == spent
        # Settlements lost on the way (a crash, say): the counter says less than the ledger.
        await client.hset(key, "spent", "0")
        status, out, err = await run(ini, capsys, "limits", "rebase")
        assert status == 0, err
        assert f"rebased shared state (redis, prefix {prism_redis.prefix}): 1 budget " in out
        assert "rebuilt from the ledger on its next use" in out
        # The fleet's ledger is this gateway's SQLite file: the command says what that means.
        assert "note: " in out and "own SQLite file" in out
        assert await client.hget(key, "spent") is None
        await chat(gw, max_tokens=5)
        await settled(gw)
        assert int(await client.hget(key, "spent")) == ledger_nanos(tmp_path / "ledger.sqlite")
        # Nothing left to drop but what the call rebuilt.
        status, out, _ = await run(ini, capsys, "limits", "rebase")
        assert status == 0 and ": 1 budget counters dropped" in out
    finally:
        await client.aclose()


async def test_rebase_without_shared_state_says_each_gateway_rebuilds_at_start(
    prism_gateway, prism_fake, tmp_path, capsys
):
    sections = {"billing": {"ledger_path": "ledger.sqlite"}, "limits": {"budget": "1/day"}}
    _, ini = await setup(
        prism_gateway, prism_fake, tmp_path, sections, ["openai", "limits", "billing"]
    )
    status, out, err = await run(ini, capsys, "limits", "rebase")
    assert status == 2 and out == ""
    assert "prism limits rebase: no shared state" in err
    assert "rebuilds its budget counters from the ledger when it starts" in err


async def test_show_reads_the_fleets_counters_and_the_ledger(
    prism_gateway, prism_fake, prism_redis, tmp_path, capsys
):
    limits = {"rpm": 50, "tpm": 100000, "max_parallel": 4, "budget": "1/total"}
    sections = fleet_sections(prism_redis, **limits)
    gw, ini = await setup(prism_gateway, prism_fake, tmp_path, sections)
    for _ in range(3):
        await chat(gw, max_tokens=5)
    await settled(gw)
    spent = ledger_nanos(tmp_path / "ledger.sqlite")

    status, out, err = await run(ini, capsys, "limits", "show", "--anonymous", "--json")
    assert status == 0, err
    shown = orjson.loads(out)
    assert shown["subject"] == {"kind": "anonymous", "name": None, "organisation": None}
    assert shown["counted"] == "fleet" and shown["gateways"] == 1
    by_limit = {entry["limit"]: entry for entry in shown["limits"]}
    assert list(by_limit) == ["rpm", "tpm", "max_parallel", "budget"]
    rpm = by_limit["rpm"]
    assert (rpm["value"], rpm["used"], rpm["remaining"], rpm["source"]) == (50, 3, 47, "fleet")
    assert 0 < rpm["resets_in_s"] <= 60
    assert 0 < by_limit["tpm"]["used"] < 100
    assert by_limit["max_parallel"]["used"] == 0  # every call settled
    budget = by_limit["budget"]
    assert budget["used"] == _money(spent) and budget["reserved"] == "0"
    assert budget["period"] == "total" and budget["resets_at"] is None
    assert budget["source"] == "fleet"

    # A budget the fleet does not hold (flushed, say) is read from the ledger.
    client = aioredis.Redis.from_url(prism_redis.url)
    try:
        await client.delete(f"{prism_redis.prefix}:{ANONYMOUS_TOTAL}")
    finally:
        await client.aclose()
    status, out, err = await run(ini, capsys, "limits", "show", "--anonymous")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "callers without a key"
    assert lines[1] == (
        f"counted across the fleet in shared state (redis, prefix {prism_redis.prefix}); "
        "1 gateway admitted calls in the last 30 s"
    )
    assert lines[2].split() == [
        "owner", "limit", "value", "used", "reserved", "remaining", "resets", "from",
    ]  # fmt: skip
    budget_row = next(line for line in lines if " budget " in line)
    assert budget_row.startswith("callers without a key  budget")
    assert budget_row.split()[6:] == [
        "USD/total", _money(spent), "0", _money(10**9 - spent), "never", "(total)", "ledger",
    ]  # fmt: skip
    rpm_row = next(line for line in lines if " rpm " in line).split()
    assert rpm_row[5:10] == ["50", "3", "-", "47", "in"] and rpm_row[-1] == "fleet"

    status, _, err = await run(ini, capsys, "limits", "show", "--anonymous", "--model", "nope")
    assert status == 2 and "--model: 'nope' is not in the catalog" in err


async def test_show_without_shared_state_reads_budgets_from_the_ledger(
    prism_gateway, prism_fake, tmp_path, capsys
):
    sections = {
        "billing": {"ledger_path": "ledger.sqlite"},
        "limits": {"rpm": 10, "budget": "2/day"},
    }
    gw, ini = await setup(
        prism_gateway, prism_fake, tmp_path, sections, ["openai", "limits", "billing"]
    )
    await chat(gw, max_tokens=5)
    spent = ledger_nanos(tmp_path / "ledger.sqlite")
    status, out, err = await run(ini, capsys, "limits", "show", "--anonymous", "--json")
    assert status == 0, err
    shown = orjson.loads(out)
    assert shown["counted"] == "per process" and shown["gateways"] is None
    rpm, budget = shown["limits"]
    assert (rpm["used"], rpm["remaining"], rpm["source"]) == (None, None, None)
    assert budget["used"] == _money(spent) and budget["source"] == "ledger"
    assert budget["reserved"] is None  # in flight in each gateway process: not known here
    assert budget["resets_at"] is not None and 0 < budget["resets_in_s"] <= 86400
    assert any("counted inside each gateway process" in note for note in shown["notes"])
    status, out, _ = await run(ini, capsys, "limits", "show", "--anonymous")
    assert status == 0 and "counted in each gateway process (no shared state)" in out
    assert " UTC (in " in out


async def test_show_names_what_is_missing_to_look_an_organisation_up(
    prism_gateway, prism_fake, tmp_path, capsys
):
    sections = {"billing": {"ledger_path": "ledger.sqlite"}}
    _, ini = await setup(
        prism_gateway, prism_fake, tmp_path, sections, ["openai", "limits", "billing"]
    )
    status, out, err = await run(ini, capsys, "limits", "show", "acme")
    assert status == 2 and out == ""
    assert "prism limits show: no loaded plugin says who an organisation or a key id is" in err
    assert "prism-keys" in err
    status, _, err = await run(ini, capsys, "limits", "show")
    assert status == 2 and "give ORG|KEY_ID (or --anonymous)" in err


async def test_prism_check_says_a_fleet_needs_one_shared_ledger(
    prism_gateway, prism_fake, prism_redis, tmp_path, capsys
):
    _, ini = await setup(prism_gateway, prism_fake, tmp_path, fleet_sections(prism_redis))
    status, out, err = await run(ini, capsys, "check", "--offline")
    assert status == 0, err
    lines = [line for line in out.splitlines() if line.startswith("limits: ")]
    assert lines[0] == (
        f"limits: counted across the fleet in shared state (redis, prefix {prism_redis.prefix});"
        " while it does not answer: share (on_shared_state_loss)"
    )
    assert "its own SQLite file: a rebuild sees only this gateway's spend" in lines[1]
    assert "[prism:billing] ledger_url" in lines[1]

    # One PostgreSQL ledger for the fleet: nothing to say about it.
    text = ini.read_text().replace(
        "ledger_path = ledger.sqlite", "ledger_url = postgresql://prism@127.0.0.1:9/ledger"
    )
    ini.write_text(text)
    status, out, err = await run(ini, capsys, "check", "--offline")
    assert status == 0, err
    assert [line for line in out.splitlines() if line.startswith("limits: ")] == lines[:1]


@pytest.mark.skipif(
    "principals" not in SERVICES,
    reason="this Prism does not declare the principals service that prism-keys provides",
)
async def test_show_an_organisation_and_a_key_set_with_the_keys_cli(
    prism_gateway, prism_fake, prism_redis, tmp_path, capsys
):
    sections = {**fleet_sections(prism_redis), "keys": {"db_path": "keys.db", "refresh_s": 300}}
    plugins = [*PLUGINS, "keys"]
    gw, ini = await setup(prism_gateway, prism_fake, tmp_path, sections, plugins)
    status, out, err = await run(ini, capsys, "keys", "create", "--org", "acme", "--scopes", "*")
    assert status == 0, err
    key = out.rstrip("\n").splitlines()[-1]
    key_id = key.split("-")[2]
    settings = ["rpm=600", "budget=250/month", "budget@m=50/day"]
    assert (await run(ini, capsys, "keys", "org-set", "acme", *settings))[0] == 0
    assert (await run(ini, capsys, "keys", "set", key_id, "tpm=20000"))[0] == 0
    from prism_keys import ring_of

    ring = ring_of(gw.gateway.current)
    assert ring is not None
    await ring.refresh_now()
    async with gw.openai(api_key=key) as client:
        await client.chat.completions.create(model="m", messages=HI, max_tokens=5)
    await settled(gw)

    status, out, err = await run(ini, capsys, "limits", "show", "acme", "--json")
    assert status == 0, err
    shown = orjson.loads(out)
    assert shown["subject"] == {"kind": "organisation", "name": "acme", "organisation": "acme"}
    assert [(e["owner"], e["limit"]) for e in shown["limits"]] == [
        ("organisation", "rpm"),
        ("organisation", "budget"),
        ("organisation", "budget@m"),
    ]
    assert shown["limits"][0]["used"] == 1 and shown["limits"][0]["source"] == "fleet"
    status, out, err = await run(ini, capsys, "limits", "show", key_id)
    assert status == 0, err
    assert out.splitlines()[0] == f"key {key_id} (organisation acme)"
    assert f"key {key_id}" in out and "tpm" in out and "budget@m" in out
    assert key not in out  # an id, never the key
    status, out, err = await run(ini, capsys, "limits", "show", "nobody")
    assert (status, out) == (1, "")
    assert "prism limits show: no organisation or key id 'nobody'" in err
    status, _, err = await run(ini, capsys, "limits", "show", "--key", "acme")
    assert status == 1 and "no active key id 'acme'" in err


def _money(nanos: int) -> str:
    from prism_limits.limits import format_money

    return format_money(nanos)
