"""With prism-keys: organisations never share entries, and `cache=off` is an org setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prism_proxy.cli import main
from prism_proxy.testing import installed_plugins

from .conftest import HI, catalog

PLUGINS = ["openai", "anthropic", "keys", "cache"]


def write_ini(tmp_path: Path) -> Path:
    others = sorted(set(installed_plugins()) - set(PLUGINS))
    (tmp_path / "catalog.toml").write_text(
        '[providers.a]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[models.m]\nchain = [{ provider = "a", model = "up" }]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\ncatalog = catalog.toml\ndisable = {', '.join(others)}\n"
        "[prism:keys]\ndb_path = keys.db\n[prism:cache]\nstore = memory\n"
    )
    return ini


def keys(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["keys", *args, "--config", str(ini)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def create_key(ini: Path, capsys: pytest.CaptureFixture[str], org: str) -> str:
    status, out, err = keys(ini, capsys, "create", "--org", org, "--scopes", "*")
    assert status == 0, err
    return out.rstrip("\n").splitlines()[-1]


async def test_keys_of_two_organisations_never_share_and_an_org_can_opt_out(
    prism_gateway, prism_fake, tmp_path, capsys
):
    ini = write_ini(tmp_path)
    acme_one, acme_two = create_key(ini, capsys, "acme"), create_key(ini, capsys, "acme")
    globex = create_key(ini, capsys, "globex")
    quiet = create_key(ini, capsys, "quiet")
    assert keys(ini, capsys, "org-set", "quiet", "cache=off")[0] == 0
    status, _, err = keys(ini, capsys, "org-set", "quiet", "cache=sometimes")
    assert status == 2 and "cache" in err
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"keys": {"db_path": "keys.db", "refresh_s": 300}, "cache": {"store": "memory"}},
        base_dir=tmp_path,
        load_plugins=PLUGINS,
    )

    async def chat(key: str) -> Any:
        async with gw.openai(api_key=key) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=HI, temperature=0
            )
            return raw.headers["x-prism-cache"]

    assert await chat(acme_one) == "miss"
    assert await chat(acme_two) == "hit"  # one organisation, two keys: shared
    assert await chat(globex) == "miss"  # never across organisations
    assert await chat(globex) == "hit"
    assert await chat(quiet) == "bypass; reason=org"
    assert await chat(quiet) == "bypass; reason=org"
    assert prism_fake.hits("a") == 4
