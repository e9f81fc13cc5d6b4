"""Limits set the way an operator sets them: `prism keys org-set` and `prism keys set`."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from prism_keys import ring_of

from prism_proxy.cli import main
from prism_proxy.testing import installed_plugins

from .conftest import catalog

HI = [{"role": "user", "content": "hi"}]
PLUGINS = ["openai", "keys", "limits", "billing"]


def write_ini(tmp_path: Path) -> Path:
    others = sorted(set(installed_plugins()) - set(PLUGINS))
    (tmp_path / "catalog.toml").write_text(
        '[providers.a]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[models.m]\nchain = [{ provider = "a", model = "up", '
        "price = { input = 1.0, output = 2.0 } }]\n"
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\ncatalog = catalog.toml\ndisable = {', '.join(others)}\n"
        "[prism:keys]\ndb_path = keys.db\n[prism:billing]\nledger_path = ledger.sqlite\n"
    )
    return ini


def keys(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["keys", *args, "--config", str(ini)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def create_key(ini: Path, capsys: pytest.CaptureFixture[str], org: str) -> tuple[str, str]:
    status, out, err = keys(ini, capsys, "create", "--org", org, "--scopes", "*")
    assert status == 0, err
    key = out.rstrip("\n").splitlines()[-1]
    return key, key.split("-")[2]


async def test_limits_set_with_the_keys_cli_are_enforced(
    prism_gateway, prism_fake, tmp_path, capsys
):
    ini = write_ini(tmp_path)
    one, one_id = create_key(ini, capsys, "acme")
    two, _ = create_key(ini, capsys, "acme")
    assert keys(ini, capsys, "org-set", "acme", "rpm=3")[0] == 0
    assert keys(ini, capsys, "set", one_id, "rpm=1", "budget@m=1/day")[0] == 0
    status, _, err = keys(ini, capsys, "set", one_id, "rpm=often")
    assert status == 2 and "rpm" in err and "whole number" in err
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={
            "keys": {"db_path": "keys.db", "refresh_s": 300},
            "billing": {"ledger_path": "ledger.sqlite"},
        },
        base_dir=tmp_path,
        load_plugins=PLUGINS,
    )

    async def chat(key: str) -> object:
        async with gw.openai(api_key=key) as client:
            return await client.chat.completions.with_raw_response.create(
                model="m", messages=HI, max_tokens=10
            )

    first = await chat(one)
    assert first.headers["x-ratelimit-limit-requests"] == "1"
    assert first.headers["x-prism-budget-remaining"]
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(one)
    assert f"key {one_id} rpm 1" in refused.value.message
    await chat(two)
    await chat(two)  # the refused call counted nothing: three served
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(two)
    assert "organisation acme rpm 3" in refused.value.message
    # A change made with the CLI reaches the running gateway at its next refresh.
    assert keys(ini, capsys, "org-set", "acme", "--unset", "rpm")[0] == 0
    assert await ring_of(gw.gateway.current).refresh_now()
    await chat(two)
