"""Shared pieces for the billing tests: priced catalogs, a billing gateway, ledger reads."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from prism_proxy import Principal, hookimpl

ADMIN_ENV = "PRISM_BILLING_TEST_ADMIN"
ADMIN_TOKEN = "billing-admin-token"

PRICE_A = {"input": 3.0, "output": 15.0, "cached_input": 0.3}
PRICE_B = {"input": 1.0, "output": 2.0}


def priced_catalog(fake: Any, *lines: tuple[str, dict[str, Any] | None], **model: Any) -> dict:
    """Model ``m`` with one chain line per ``(scenario, price)``; provider = scenario."""
    chain = []
    for scenario, price in lines:
        line: dict[str, Any] = {"provider": scenario, "model": f"up-{scenario}"}
        if price is not None:
            line["price"] = price
        chain.append(line)
    return {
        "providers": {s: {"kind": "openai", "base_url": fake.base_url(s)} for s, _ in lines},
        "models": {"m": {"chain": chain, "retries": 0, **model}},
    }


def expected_cost(price: dict[str, float], inp: int, out: int, cached: int = 0) -> Decimal:
    """The cost rule, written out independently of the plugin."""
    cached_price = Decimal(repr(price.get("cached_input", price["input"])))
    return (
        (inp - cached) * Decimal(repr(price["input"]))
        + cached * cached_price
        + out * Decimal(repr(price["output"]))
    ) / Decimal(1_000_000) + Decimal(repr(price.get("request", 0)))


class Ledger:
    """Reads the ledger file the way an auditor would: a plain sqlite3 connection."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM ledger ORDER BY ts")]
        finally:
            conn.close()

    def row(self, request_id: str) -> dict[str, Any]:
        found = [r for r in self.rows() if r["request_id"] == request_id]
        assert len(found) == 1, f"expected one row for {request_id}, got {found}"
        return found[0]

    @staticmethod
    def cost(row: dict[str, Any]) -> Decimal:
        return Decimal(row["cost_nanos"]).scaleb(-9)


class KeyAuth:
    """A stand-in auth plugin: ``x-test-key: <key>@<org>`` names the caller."""

    @hookimpl
    def prism_authenticate(self, call: Any) -> Principal | None:
        value = call.request.headers.get("x-test-key")
        if not value:
            return None
        key, _, org = value.partition("@")
        return Principal(key_id=key, org=org or None)

    @hookimpl
    def prism_call_start(self, call: Any) -> None:
        traffic = call.request.headers.get("x-test-traffic")
        if traffic:
            call.traffic = traffic


StartBilling = Callable[..., Awaitable[Any]]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


@pytest.fixture
def billing_gateway(
    prism_gateway: Any, prism_plugin: Any, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> StartBilling:
    """Start a gateway with billing on (ledger in tmp), the test auth plugin and an admin token."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    prism_plugin(KeyAuth(), "test-key-auth")

    async def start(catalog: dict, **billing: Any) -> Any:
        section = {"ledger_path": str(ledger.path), **billing}
        return await prism_gateway(
            catalog, config={"admin_token_env": ADMIN_ENV}, sections={"billing": section}
        )

    return start
