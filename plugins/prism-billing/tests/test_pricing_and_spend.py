"""The ``pricing`` and ``spend`` services billing provides, checked against the ledger itself.

Calls go through a real gateway with billing on (a SQLite file, or a
PostgreSQL database of the test's own); the services are then taken from the
generation, as prism-limits takes them, and what they say is compared with
the rows read back with plain sqlite3 / asyncpg, as an auditor would.
"""

from __future__ import annotations

import datetime
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import attrs
import pytest
from prism_billing import billing_of

from prism_proxy import PRICING, SPEND, Generation, Pricing, Spend, SpendLedger, Usage, hookimpl

from .conftest import PRICE_A, KeyAuth
from .test_billing import MESSAGES, Captured

#: A price that is not a whole number of nanos per token, and a request fee.
PRICE_ODD = {"input": 0.1234567, "output": 2.5, "request": 0.0001}
#: The first call's settle time; call ``i`` settles ``i`` minutes later (across midnight).
START = datetime.datetime(2026, 10, 31, 23, 57, tzinfo=datetime.UTC)

Rows = Callable[[], Awaitable[list[dict[str, Any]]]]


@attrs.frozen
class LedgerUnderTest:
    """A ledger setting for ``[prism:billing]``, and how to read its rows back."""

    section: dict[str, str]
    rows: Rows


def _sqlite_rows(path: Path) -> Rows:
    async def read() -> list[dict[str, Any]]:
        conn = sqlite3.connect(path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM ledger")]
        finally:
            conn.close()

    return read


def _pg_rows(url: str) -> Rows:
    async def read() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(url, timeout=5)
        try:
            return [dict(r) for r in await conn.fetch("SELECT * FROM ledger")]
        finally:
            await conn.close()

    return read


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> LedgerUnderTest:
    if request.param == "sqlite":
        path = tmp_path / "ledger.sqlite"
        return LedgerUnderTest({"ledger_path": str(path)}, _sqlite_rows(path))
    url: str = request.getfixturevalue("prism_postgres")  # a fresh database, dropped after
    return LedgerUnderTest({"ledger_url": url}, _pg_rows(url))


class Consumer:
    """Takes the services in prism_generation, as a limits plugin would (before billing's
    own prism_generation has run, or after: registration order decides, and must not matter)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Pricing | None, SpendLedger | None]] = []

    @hookimpl
    def prism_generation(self, generation: Generation) -> None:
        self.seen.append((generation.services.get(PRICING), generation.services.get(SPEND)))


def catalog(fake: Any) -> dict[str, Any]:
    def line(provider: str, price: dict[str, float] | None) -> dict[str, Any]:
        found: dict[str, Any] = {"provider": provider, "model": f"up-{provider}"}
        if price is not None:
            found["price"] = price
        return found

    return {
        "providers": {
            name: {"kind": "openai", "base_url": fake.base_url(name)}
            for name in ("alpha", "beta", "gamma", "err500")
        },
        "models": {
            "m": {"chain": [line("alpha", PRICE_A)], "retries": 0},
            "n": {"chain": [line("beta", PRICE_ODD)], "retries": 0},
            "free": {"chain": [line("gamma", None)], "retries": 0},  # unpriced: billed 0
            "down": {"chain": [line("err500", PRICE_A)], "retries": 0},
        },
    }


@attrs.frozen
class Traffic:
    """What one scenario sent: request ids in order, and the calls the core settled."""

    gw: Any
    ids: list[str | None]
    captured: Captured
    ledger: LedgerUnderTest

    @property
    def generation(self) -> Generation:
        current: Generation = self.gw.gateway.current
        return current


# (model, caller, traffic, stream, expected status); caller "key@org", None: anonymous.
CALLS: list[tuple[str, str | None, str | None, bool, int]] = [
    ("m", "k1@acme", None, False, 200),  # 0
    ("m", "k1@acme", None, True, 200),  # 1: streamed
    ("n", "k1@acme", None, False, 200),  # 2
    ("m", "k2@acme", None, False, 200),  # 3: the first call of 2026-11-01
    ("n", "k3@globex", None, False, 200),  # 4
    ("m", None, None, False, 200),  # 5: anonymous
    ("alpha/up-alpha", "k1@acme", None, False, 200),  # 6: a pinned line
    ("free", "k1@acme", None, False, 200),  # 7: served by an unpriced line
    ("m", "k1@acme", "probe", False, 200),  # 8: operator traffic
    ("m", "k1@acme", "preflight", False, 200),  # 9: operator traffic
    ("down", "k1@acme", None, False, 503),  # 10: every line failed: a row, nothing served
    ("nope", "k1@acme", None, False, 404),  # 11: refused before a model resolved: no row
]


def settled_at(index: int) -> datetime.datetime:
    return START + datetime.timedelta(minutes=index)


async def send(
    gw: Any, index: int, model: str, caller: str | None, traffic: str | None, stream: bool
) -> tuple[int, str | None]:
    billing = billing_of(gw.gateway.current)
    assert billing is not None
    billing.now = lambda: settled_at(index).timestamp()
    headers = {}
    if caller is not None:
        headers["x-test-key"] = caller
    if traffic is not None:
        headers["x-test-traffic"] = traffic
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": model, "messages": MESSAGES, "stream": stream},
            headers=headers,
        ) as response:
            await response.read()  # a stream's row is committed before its final event
            return response.status, response.headers.get("x-prism-request-id")


@pytest.fixture
async def traffic(
    prism_fake: Any,
    prism_gateway: Any,
    prism_plugin: Any,
    ledger_under_test: LedgerUnderTest,
) -> Traffic:
    prism_plugin(KeyAuth(), "test-key-auth")
    captured = Captured()
    prism_plugin(captured, "test-captured")
    section = {**ledger_under_test.section, "require_prices": "false", "currency": "EUR"}
    gw = await prism_gateway(catalog(prism_fake), sections={"billing": section})
    ids = []
    for index, (model, caller, kind, stream, status) in enumerate(CALLS):
        got, request_id = await send(gw, index, model, caller, kind, stream)
        assert got == status, (index, model)
        ids.append(request_id)
    return Traffic(gw, ids, captured, ledger_under_test)


def sums(rows: Iterable[dict[str, Any]]) -> dict[tuple[str | None, str | None, str], Spend]:
    """The totals written out from the rows, independently of the plugin's SQL."""
    out: dict[tuple[str | None, str | None, str], Spend] = {}
    for row in rows:
        key = (row["org"], row["key_id"], row["model"])
        was = out.get(key, Spend())
        out[key] = Spend(
            calls=was.calls + 1,
            tokens=was.tokens + row["input_tokens"] + row["output_tokens"],
            nanos=was.nanos + row["cost_nanos"],
        )
    return out


async def rows_of(traffic: Traffic, indexes: Iterable[int]) -> list[dict[str, Any]]:
    by_id = {row["request_id"]: row for row in await traffic.ledger.rows()}
    return [by_id[traffic.ids[i]] for i in indexes if traffic.ids[i] in by_id]


def spend_of(traffic: Traffic) -> SpendLedger:
    spend = traffic.generation.services.get(SPEND)
    assert isinstance(spend, SpendLedger)
    return spend


async def test_the_ledger_holds_what_the_scenario_needs(traffic):
    rows = {row["request_id"]: row for row in await traffic.ledger.rows()}
    # Every call that resolved a model has its row; the unknown model has none.
    assert set(rows) == set(traffic.ids[:11])
    assert [rows[traffic.ids[i]]["traffic"] for i in (8, 9)] == ["probe", "preflight"]
    failed = rows[traffic.ids[10]]
    assert (failed["outcome"], failed["provider"], failed["cost_nanos"]) == ("error", None, 0)
    # The model column holds the name the call resolved to: the catalog model's,
    # or the pinned line's provider/upstream-model.
    assert [rows[traffic.ids[i]]["model"] for i in (0, 2, 6, 7)] == [
        "m",
        "n",
        "alpha/up-alpha",
        "free",
    ]
    assert rows[traffic.ids[7]]["unpriced"] and rows[traffic.ids[7]]["cost_nanos"] == 0
    assert all(rows[traffic.ids[i]]["cost_nanos"] > 0 for i in (0, 1, 2, 3, 4, 5, 6, 8, 9))


async def test_pricing_costs_what_the_ledger_row_records(traffic):
    pricing = traffic.generation.services.get(PRICING)
    assert isinstance(pricing, Pricing)
    assert pricing.currency == "EUR"
    rows = {row["request_id"]: row for row in await traffic.ledger.rows()}
    served = [(call, s) for call, s in traffic.captured.seen if s.served is not None]
    # Every served call, customer and operator alike, priced by the service as billed.
    assert len(served) == 10
    for call, settlement in served:
        row = rows[call.request_id]
        binding = settlement.served.binding
        assert pricing.cost(binding, settlement.usage) == row["cost_nanos"], call.model_name
        # The same from the row's own counts: what a limits plugin recounting a call gets.
        usage = Usage(
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            cached_input_tokens=row["cached_input_tokens"],
            cache_creation_tokens=row["cache_creation_tokens"],
        )
        assert pricing.cost(binding, usage) == row["cost_nanos"]
        assert pricing.priced(binding) is (call.model_name != "free")
    catalog = traffic.generation.catalog
    fee_only = pricing.cost(catalog.models["n"].chain[0], None)
    assert fee_only == 100_000  # the 0.0001 request fee, in nanos
    assert pricing.cost(catalog.models["free"].chain[0], Usage(input_tokens=10**6)) == 0


async def test_spend_since_ever_sums_the_served_customer_rows(traffic):
    spend = await spend_of(traffic).spend_since(None)
    customer_served = await rows_of(traffic, range(8))
    assert dict(spend) == sums(customer_served)
    assert set(spend) == {
        ("acme", "k1", "m"),
        ("acme", "k1", "n"),
        ("acme", "k2", "m"),
        ("globex", "k3", "n"),
        (None, None, "m"),
        ("acme", "k1", "alpha/up-alpha"),
        ("acme", "k1", "free"),
    }
    # Two served calls: the probe, the preflight and the failed call are not spend.
    k1_m = spend[("acme", "k1", "m")]
    assert k1_m.calls == 2
    (first, second) = await rows_of(traffic, (0, 1))
    assert k1_m.nanos == first["cost_nanos"] + second["cost_nanos"]
    assert k1_m.tokens == sum(r["input_tokens"] + r["output_tokens"] for r in (first, second))
    # An unpriced line's calls count, at 0.
    free = spend[("acme", "k1", "free")]
    assert (free.calls, free.nanos) == (1, 0) and free.tokens > 0


async def test_spend_since_counts_calls_settled_at_or_after_since(traffic):
    spend = spend_of(traffic)
    midnight = settled_at(3)  # 2026-11-01T00:00:00Z: calls 3.. settled at or after it
    assert midnight == datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    assert dict(await spend.spend_since(midnight)) == sums(await rows_of(traffic, range(3, 8)))
    # Within a day: the day alone would not tell call 4 from call 5.
    assert dict(await spend.spend_since(settled_at(5))) == sums(await rows_of(traffic, range(5, 8)))
    # The ledger stamps to the millisecond: a since in the row's millisecond counts it,
    # one millisecond later does not.
    within = settled_at(5) + datetime.timedelta(microseconds=999)
    assert dict(await spend.spend_since(within)) == sums(await rows_of(traffic, range(5, 8)))
    later = settled_at(5) + datetime.timedelta(milliseconds=1)
    assert dict(await spend.spend_since(later)) == sums(await rows_of(traffic, range(6, 8)))
    # Another time zone is the same instant; a naive since is UTC.
    paris = datetime.timezone(datetime.timedelta(hours=1))
    assert dict(await spend.spend_since(midnight.astimezone(paris))) == dict(
        await spend.spend_since(midnight)
    )
    assert dict(await spend.spend_since(midnight.replace(tzinfo=None))) == dict(
        await spend.spend_since(midnight)
    )
    assert dict(await spend.spend_since(settled_at(60))) == {}
    assert dict(await spend.spend_since(datetime.datetime(1, 1, 1))) == dict(
        await spend.spend_since(None)
    )


async def test_a_snapshot_names_the_recent_calls_its_totals_count(traffic):
    spend = spend_of(traffic)
    midnight = settled_at(3)
    snapshot = await spend.spend_snapshot(midnight, settled_at(5))
    # The totals are spend_since's; the recent ids are the counted rows from call 5 on.
    assert dict(snapshot.totals) == dict(await spend.spend_since(midnight))
    recent: dict[Any, set[str]] = {}
    for row in await rows_of(traffic, range(5, 8)):
        recent.setdefault((row["org"], row["key_id"], row["model"]), set()).add(row["request_id"])
    assert recent and {k: set(v) for k, v in snapshot.recent.items()} == recent
    # Rows the totals do not count (before since, probes, unserved) are never named.
    early = await spend.spend_snapshot(settled_at(6), settled_at(0))
    named = set().union(*early.recent.values())
    assert named == {row["request_id"] for row in await rows_of(traffic, range(6, 8))}


async def test_the_services_are_one_per_generation_and_read_the_kept_ledger(
    prism_fake, prism_gateway, prism_plugin, ledger_under_test
):
    prism_plugin(KeyAuth(), "test-key-auth")
    consumer = Consumer()
    prism_plugin(consumer, "test-consumer")
    section = {**ledger_under_test.section, "require_prices": "false"}
    gw = await prism_gateway(catalog(prism_fake), sections={"billing": section})
    generation = gw.gateway.current
    ((pricing, spend),) = consumer.seen
    # What a plugin took in its prism_generation is what the generation hands everyone.
    assert pricing is generation.services.get(PRICING)
    assert spend is generation.services.get(SPEND)
    assert isinstance(pricing, Pricing) and isinstance(spend, SpendLedger)
    assert generation.services.provider(SPEND) == generation.services.provider(PRICING)
    assert await spend.spend_since(None) == {}
    assert (await send(gw, 0, "m", "k1@acme", None, False))[0] == 200
    before = await spend.spend_since(None)
    assert before[("acme", "k1", "m")].calls == 1
    # A reload: a new generation, new services, the same ledger.
    following = await gw.gateway.reload(generation.config)
    assert len(consumer.seen) == 2
    again = following.services.get(SPEND)
    assert isinstance(again, SpendLedger)
    assert again is not spend and again is consumer.seen[1][1]
    assert await again.spend_since(None) == before
    assert (await send(gw, 1, "m", "k1@acme", None, False))[0] == 200
    after = await again.spend_since(None)
    assert after[("acme", "k1", "m")].calls == 2


async def test_billing_off_provides_neither(prism_fake, prism_gateway, prism_plugin):
    consumer = Consumer()
    prism_plugin(consumer, "test-consumer")
    gw = await prism_gateway(catalog(prism_fake))
    generation = gw.gateway.current
    assert consumer.seen == [(None, None)]
    assert generation.services.provider(PRICING) is None
    assert generation.services.provider(SPEND) is None
