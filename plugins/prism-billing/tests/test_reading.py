"""Reading the ledger: GET /prism/usage and `prism ledger export`."""

from __future__ import annotations

import csv
import datetime
import io
import json
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from prism_billing import billing_of

from prism_proxy.cli import main

from .conftest import ADMIN_ENV, ADMIN_TOKEN, PRICE_B, priced_catalog

MESSAGES = [{"role": "user", "content": "hello there"}]


def at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


async def call_at(gw: Any, when: str, key: str, traffic: str | None = None) -> str:
    """One call whose row is stamped ``when`` (UTC), made as ``key`` (``id@org``)."""
    billing = billing_of(gw.gateway.current)
    assert billing is not None
    billing.now = lambda: at(when)
    headers = {"x-test-key": key, **({"x-test-traffic": traffic} if traffic else {})}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES},
            headers=headers,
        ) as response:
            assert response.status == 200
            return response.headers["x-prism-request-id"]


@pytest.fixture
async def three_days(prism_fake, billing_gateway):
    """Calls either side of midnight and on the next day, by two organisations."""
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_B)))
    ids = [
        await call_at(gw, "2026-10-31T23:59:59", "k1@acme"),
        await call_at(gw, "2026-11-01T00:00:01", "k1@acme"),
        await call_at(gw, "2026-11-01T12:00:00", "k2@acme"),
        await call_at(gw, "2026-11-02T08:00:00", "k3@globex"),
        await call_at(gw, "2026-11-02T09:00:00", "k3@globex", traffic="probe"),
    ]
    return gw, ids


async def get(gw: Any, path: str, token: str | None = ADMIN_TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + path, headers=headers) as response:
            return response.status, await response.json()


# The fake answers "hello there" with 2 prompt and 9 completion tokens at 1.0 / 2.0 per million.
ONE_CALL = Decimal("0.00002")


async def test_usage_totals_per_org_and_day_since_a_day(three_days):
    gw, _ = three_days
    status, body = await get(gw, "/prism/usage?since=2026-11-01&group_by=org,day")
    assert status == 200
    assert [(g["org"], g["day"], g["calls"]) for g in body["groups"]] == [
        ("acme", "2026-11-01", 2),
        ("globex", "2026-11-02", 1),  # its probe is not a customer's usage
    ]
    assert body["total"]["calls"] == 3
    assert Decimal(body["total"]["cost"]) == 3 * ONE_CALL
    assert body["currency"] == "USD"


async def test_usage_defaults_to_key_org_model_and_day(three_days):
    gw, _ = three_days
    status, body = await get(gw, "/prism/usage?until=2026-11-02")
    assert status == 200
    assert body["group_by"] == ["org", "key", "model", "day"]
    assert [(g["org"], g["key"], g["model"], g["day"]) for g in body["groups"]] == [
        ("acme", "k1", "m", "2026-10-31"),
        ("acme", "k1", "m", "2026-11-01"),
        ("acme", "k2", "m", "2026-11-01"),
    ]
    group = body["groups"][0]
    assert (group["served_calls"], group["input_tokens"], group["output_tokens"]) == (1, 2, 9)
    assert Decimal(group["cost"]) == ONE_CALL


async def test_usage_filters_by_key(three_days):
    gw, _ = three_days
    status, body = await get(gw, "/prism/usage?key=k1&group_by=")
    assert (status, body["groups"], body["total"]["calls"]) == (200, [], 2)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("since=2026-13-01", "since"),
        ("until=yesterday", "until"),
        ("group_by=org,colour", "group_by"),
        ("group_by=org,org", "group_by"),
        ("traffic=robots", "traffic"),
        ("sinse=2026-11-01", "sinse"),
    ],
)
async def test_usage_rejects_bad_queries_naming_the_parameter(three_days, query, param):
    gw, _ = three_days
    status, body = await get(gw, "/prism/usage?" + query)
    assert status == 400
    assert (body["error"]["code"], body["error"]["param"]) == ("invalid_usage_query", param)


async def test_usage_needs_the_admin_token(three_days):
    gw, _ = three_days
    assert (await get(gw, "/prism/usage", token=None))[0] == 401
    assert (await get(gw, "/prism/usage", token="guess"))[0] == 401


async def test_usage_says_when_billing_is_off(prism_fake, prism_gateway, monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    gw = await prism_gateway(
        priced_catalog(prism_fake, ("alpha", PRICE_B)), config={"admin_token_env": ADMIN_ENV}
    )
    status, body = await get(gw, "/prism/usage")
    assert (status, body["error"]["code"]) == (404, "billing_off")


def write_config(tmp_path, billing: str = "ledger_path = ledger.sqlite\n") -> str:
    ini = tmp_path / "prism.ini"
    ini.write_text(f"[prism]\ncatalog = catalog.toml\n\n[prism:billing]\n{billing}")
    return str(ini)


async def test_export_jsonl_since_a_day(three_days, tmp_path, capsys):
    _, ids = three_days
    ini = write_config(tmp_path)
    assert (
        main(["ledger", "export", "--config", ini, "--since", "2026-11-01", "--format", "jsonl"])
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["request_id"] for r in rows] == ids[1:4]
    assert {r["traffic"] for r in rows} == {"customer"}
    assert rows[0]["provider"] == "alpha" and rows[0]["model"] == "m"
    assert Decimal(rows[0]["cost"]) == ONE_CALL


async def test_export_csv_to_a_file_with_every_traffic(three_days, tmp_path, capsys):
    _, ids = three_days
    out = tmp_path / "bill.csv"
    ini = write_config(tmp_path)
    args = ["ledger", "export", "--config", ini, "--since", "2026-11-02", "--output", str(out)]
    assert main([*args, "--traffic", "all"]) == 0
    assert "exported 2 rows" in capsys.readouterr().err
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["request_id"], r["traffic"]) for r in rows] == [
        (ids[3], "customer"),
        (ids[4], "probe"),
    ]
    assert rows[0]["org"] == "globex" and Decimal(rows[0]["cost"]) == ONE_CALL
    assert "cost_nanos" not in rows[0]


def test_export_without_a_ledger_says_why(tmp_path, capsys):
    assert (
        main(["ledger", "export", "--config", write_config(tmp_path, ""), "--since", "2026-11-01"])
        == 2
    )
    assert "ledger_path: not set" in capsys.readouterr().err
    ini = write_config(tmp_path)
    assert main(["ledger", "export", "--config", ini, "--since", "2026-11-01"]) == 2
    assert "no ledger at" in capsys.readouterr().err


def test_export_rejects_a_bad_day(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["ledger", "export", "--config", write_config(tmp_path), "--since", "Nov 1"])
    assert "expected a day as YYYY-MM-DD" in capsys.readouterr().err
