"""Billing through the real gateway: what is billed, at which line's price, and when.

Every test reads the ledger file with plain sqlite3, as an auditor would.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import aiohttp
import attrs
import openai
import orjson
import pytest
from prism_billing import billing_of
from prism_fake_upstream import Fault

from prism_proxy import hookimpl

from .conftest import PRICE_A, PRICE_B, Ledger, expected_cost, priced_catalog

MESSAGES = [{"role": "user", "content": "hello there"}]  # the fake counts 2 prompt tokens
TEXT = "one two three four five six seven eight nine ten"  # 10 completion tokens
LONG_TEXT = " ".join(f"word{i}" for i in range(40))


async def chat(gw: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
    async with gw.openai() as client:
        return await client.chat.completions.with_raw_response.create(
            model=kwargs.pop("model", "m"), messages=MESSAGES, extra_headers=headers, **kwargs
        )


async def stream_lines(gw: Any, body_extra: dict[str, Any] | None = None) -> list[bytes]:
    """The raw SSE lines a streaming caller receives (an error event ends a broken stream)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True, **(body_extra or {})},
        ) as response:
            assert response.status == 200
            return [line.rstrip(b"\n") for line in await _read_lines(response) if line.strip()]


async def _read_lines(response: aiohttp.ClientResponse) -> list[bytes]:
    lines = []
    try:
        async for line in response.content:
            lines.append(line)
    except aiohttp.ClientPayloadError:
        pass
    return lines


async def test_ok_row_names_the_asked_model_and_the_serving_line(
    prism_fake, billing_gateway, ledger
):
    prism_fake.script("alpha", [Fault(text=TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    raw = await chat(gw, headers={"x-test-key": "key-7@acme"})
    # No waiting: the row is durable before the body is sent.
    row = ledger.row(raw.headers["x-prism-request-id"])
    assert {k: row[k] for k in ("model", "provider", "upstream_model", "outcome")} == {
        "model": "m",
        "provider": "alpha",
        "upstream_model": "up-alpha",
        "outcome": "ok",
    }
    assert (row["key_id"], row["org"], row["traffic"], row["endpoint"]) == (
        "key-7",
        "acme",
        "customer",
        "chat",
    )
    assert (row["input_tokens"], row["output_tokens"], row["estimated"]) == (2, 10, 0)
    cost = expected_cost(PRICE_A, 2, 10)
    assert Ledger.cost(row) == cost
    assert Decimal(raw.headers["x-prism-cost"]) == cost


async def test_cached_input_and_request_fee_are_priced_exactly(prism_fake, billing_gateway, ledger):
    price = {"input": 3.0, "output": 15.0, "cached_input": 0.3, "request": 0.001}
    # An answer long enough for the 500 completion tokens it reports.
    text = "word " * 500
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "up-alpha",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 1000,
            "completion_tokens": 500,
            "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 200},
        },
    }
    prism_fake.script("alpha", [Fault(body=body)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", price)))
    raw = await chat(gw)
    row = ledger.row(raw.headers["x-prism-request-id"])
    # 800 x 3 + 200 x 0.3 + 500 x 15 per million, plus the 0.001 fee.
    assert raw.headers["x-prism-cost"] == "0.01096"
    assert Ledger.cost(row) == Decimal("0.01096")
    assert row["cached_input_tokens"] == 200


async def test_error_row_bills_nothing_and_says_so(prism_fake, billing_gateway, ledger):
    gw = await billing_gateway(priced_catalog(prism_fake, ("err500", PRICE_A), ("err503", PRICE_B)))
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    assert info.value.status_code == 503
    assert info.value.response.headers["x-prism-cost"] == "0"
    row = ledger.row(info.value.response.headers["x-prism-request-id"])
    assert (row["outcome"], row["status"], row["provider"], row["cost_nanos"]) == (
        "error",
        503,
        None,
        0,
    )
    assert row["attempts"] == 2
    assert row["error_code"] == "upstream_unavailable"


@pytest.mark.parametrize(
    ("first", "second"),
    [(PRICE_A, PRICE_B), (PRICE_B, PRICE_A)],
    ids=["to-cheaper", "to-pricier"],
)
async def test_fallback_bills_the_line_that_served(
    prism_fake, billing_gateway, ledger, first, second
):
    prism_fake.script("beta", [Fault(text=TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("err502", first), ("beta", second)))
    raw = await chat(gw)
    row = ledger.row(raw.headers["x-prism-request-id"])
    assert (row["provider"], row["upstream_model"], row["model"]) == ("beta", "up-beta", "m")
    assert Ledger.cost(row) == expected_cost(second, 2, 10)
    assert Ledger.cost(row) != expected_cost(first, 2, 10)
    assert Decimal(raw.headers["x-prism-cost"]) == expected_cost(second, 2, 10)


async def test_failed_attempts_never_reach_the_bill(prism_fake, billing_gateway, ledger):
    prism_fake.script("beta", [Fault(text=TEXT)])
    prism_fake.script("flaky", [Fault(status=503), Fault(status=503)])
    catalog = priced_catalog(prism_fake, ("flaky", PRICE_A), ("beta", PRICE_B), retries=1)
    gw = await billing_gateway(catalog)
    raw = await chat(gw, headers={"x-test-key": "k@o"})
    assert raw.headers["x-prism-attempts"] == "3"
    rows = ledger.rows()
    assert len(rows) == 1  # one call, one row: the two failed tries left no trace in the bill
    assert rows[0]["provider"] == "beta"
    usage = await admin_get(gw, "/prism/usage?group_by=binding")
    assert [g["binding"] for g in usage["groups"]] == ["beta/up-beta"]
    assert Decimal(usage["total"]["cost"]) == expected_cost(PRICE_B, 2, 10)


async def test_stream_row_is_committed_before_the_final_event(prism_fake, billing_gateway, ledger):
    prism_fake.script("alpha", [Fault(text=TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
        ) as response:
            request_id = response.headers["x-prism-request-id"]
            async for line in response.content:
                if line.startswith(b": x-prism-cost: "):
                    # The final event has not been read yet, and the row is already there.
                    row = ledger.row(request_id)
                    announced = Decimal(line.split(b": ")[2].decode().strip())
                    break
            rest = await response.content.read()
    assert rest.strip() == b"data: [DONE]"
    assert (row["outcome"], row["estimated"], row["output_tokens"]) == ("ok", 0, 10)
    assert announced == Ledger.cost(row) == expected_cost(PRICE_A, 2, 10)


async def test_upstream_death_mid_stream_bills_the_partial_output(
    prism_fake, billing_gateway, ledger
):
    prism_fake.script("alpha", [Fault(text=LONG_TEXT, die_after_chunks=3)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    lines = await stream_lines(gw)
    error = orjson.loads(lines[-1].removeprefix(b"data: "))
    assert error["error"]["code"] == "upstream_stream_broken"
    cost_line = next(line for line in lines if line.startswith(b": x-prism-cost:"))
    row = next(r for r in ledger.rows())
    assert (row["outcome"], row["provider"], row["upstream_model"]) == (
        "error",
        "alpha",
        "up-alpha",
    )
    assert row["estimated"] == 1  # the usage chunk never came
    delivered = len("".join(LONG_TEXT.split(" ")[:3])) + 2
    assert 0 < row["output_tokens"] <= delivered < len(LONG_TEXT) // 4
    cost = expected_cost(PRICE_A, row["input_tokens"], row["output_tokens"])
    assert Ledger.cost(row) == cost > 0
    assert Decimal(cost_line.split(b": ")[2].decode()) == cost


async def test_usage_chunk_absent_means_estimated(prism_fake, billing_gateway, ledger):
    # The whole answer arrives, then the connection drops before finish and usage.
    words = TEXT.split(" ")
    prism_fake.script("alpha", [Fault(text=TEXT, die_after_chunks=len(words))])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    await stream_lines(gw)
    prism_fake.script("alpha", [Fault(text=TEXT)])
    await stream_lines(gw)
    cut, whole = ledger.rows()
    assert (whole["estimated"], whole["output_tokens"]) == (0, 10)
    assert cut["estimated"] == 1
    # Estimated from the delivered text and the prompt, not zero and not invented.
    assert 0 < cut["output_tokens"] <= len(TEXT)
    assert 0 < cut["input_tokens"] <= len("hello there")
    assert Ledger.cost(cut) == expected_cost(PRICE_A, cut["input_tokens"], cut["output_tokens"])


async def test_client_abort_mid_stream_bills_what_was_delivered(
    prism_fake, billing_gateway, ledger
):
    prism_fake.script("alpha", [Fault(token_delay_s=0.2, text=LONG_TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
        )
        request_id = response.headers["x-prism-request-id"]
        content_events = 0
        async for line in response.content:
            if b'"content":"' in line and b'"content":""' not in line:
                content_events += 1
                if content_events == 3:
                    break
        response.close()  # the caller walks away mid-answer
    row = await wait_for_row(ledger, request_id)
    assert (row["outcome"], row["status"], row["provider"]) == ("aborted", 499, "alpha")
    assert row["estimated"] == 1
    assert 0 < row["output_tokens"] < len(LONG_TEXT) // 4  # a part, not the whole answer
    assert Ledger.cost(row) == expected_cost(PRICE_A, row["input_tokens"], row["output_tokens"])
    assert Ledger.cost(row) > 0


async def wait_for_row(ledger: Ledger, request_id: str) -> dict[str, Any]:
    """The abort is noticed by the server on its own time; wait for its row, boundedly."""
    async with asyncio.timeout(10):
        while True:
            rows = [r for r in ledger.rows() if r["request_id"] == request_id]
            if rows:
                return rows[0]
            await asyncio.sleep(0.05)


class Captured:
    """Keeps the call and settlement the core hands to prism_settle."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any]] = []

    @hookimpl
    def prism_settle(self, call: Any, settlement: Any) -> None:
        self.seen.append((call, settlement))


async def test_settling_twice_leaves_one_row(prism_fake, billing_gateway, ledger, prism_plugin):
    captured = Captured()
    prism_plugin(captured, "test-captured")
    prism_fake.script("alpha", [Fault(text=TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    raw = await chat(gw)
    ((call, settlement),) = captured.seen
    first = ledger.row(call.request_id)
    # The same settlement again, and a contradicting one: neither adds or changes a row.
    billing = billing_of(gw.gateway.current)
    await billing.prism_settle(call=call, settlement=settlement)
    aborted = attrs.evolve(settlement, outcome="aborted", status=499, error_code="client_closed")
    await billing.prism_settle(call=call, settlement=aborted)
    assert ledger.rows() == [first]
    assert Decimal(raw.headers["x-prism-cost"]) == Ledger.cost(first)


async def test_probe_traffic_is_marked_and_kept_out_of_customer_totals(
    prism_fake, billing_gateway, ledger
):
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    await chat(gw, headers={"x-test-key": "k1@acme"})
    await chat(gw, headers={"x-test-key": "k1@acme", "x-test-traffic": "probe"})
    await chat(gw, headers={"x-test-key": "k1@acme", "x-test-traffic": "preflight"})
    assert sorted(r["traffic"] for r in ledger.rows()) == ["customer", "preflight", "probe"]
    customer = await admin_get(gw, "/prism/usage?group_by=org")
    assert customer["traffic"] == "customer"
    assert [(g["org"], g["calls"]) for g in customer["groups"]] == [("acme", 1)]
    probes = await admin_get(gw, "/prism/usage?group_by=traffic&traffic=all")
    assert {g["traffic"]: g["calls"] for g in probes["groups"]} == {
        "customer": 1,
        "preflight": 1,
        "probe": 1,
    }


async def test_ledger_holds_no_prompt_completion_or_key(prism_fake, billing_gateway, ledger):
    prompt = "zebra-prompt-secret-7781"
    answer = "unicorn-completion-secret-4412"
    api_key = "sk-live-DO-NOT-STORE-991"
    prism_fake.script("alpha", [Fault(text=answer), Fault(text=answer)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    async with gw.openai(api_key=api_key) as client:
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            extra_headers={"x-test-key": "k"},
        )
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], stream=True
        )
        async for _ in stream:
            pass
    assert len(ledger.rows()) == 2
    stored = b"".join(
        p.read_bytes() for p in ledger.path.parent.iterdir() if p.name.startswith("ledger.sqlite")
    )
    for secret in (prompt, answer, api_key):
        assert secret.encode() not in stored


async def test_embeddings_are_billed_at_the_input_price(prism_fake, billing_gateway, ledger):
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_B)))
    async with gw.openai() as client:
        raw = await client.embeddings.with_raw_response.create(
            model="m", input=["four words in here"]
        )
    row = ledger.row(raw.headers["x-prism-request-id"])
    assert (row["endpoint"], row["input_tokens"], row["output_tokens"]) == ("embeddings", 4, 0)
    assert Ledger.cost(row) == expected_cost(PRICE_B, 4, 0)


async def test_unpriced_line_bills_zero_when_the_operator_allows_it(
    prism_fake, billing_gateway, ledger
):
    prism_fake.script("alpha", [Fault(text=TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", None)), require_prices="false")
    raw = await chat(gw)
    row = ledger.row(raw.headers["x-prism-request-id"])
    assert (row["unpriced"], row["cost_nanos"], row["output_tokens"]) == (1, 0, 10)
    assert raw.headers["x-prism-cost"] == "0"


async def test_concurrent_calls_share_commits(prism_fake, billing_gateway, ledger):
    prism_fake.script("alpha", [Fault(first_token_delay_s=0.1)] * 40)
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    async with gw.openai() as client:
        await asyncio.gather(
            *(client.chat.completions.create(model="m", messages=MESSAGES) for _ in range(40))
        )
    assert len(ledger.rows()) == 40
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/stats") as response:
            counters = (await response.json())["counters"]
    assert counters["billing_rows"] == 40
    assert counters["billing_commits"] < 40


async def admin_get(gw: Any, path: str, token: str | None = None) -> Any:
    from .conftest import ADMIN_TOKEN

    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + path, headers={"Authorization": f"Bearer {token or ADMIN_TOKEN}"}
        ) as response:
            assert response.status == 200, await response.text()
            return await response.json()


class RouteOwnLine:
    """A routing plugin serving from a line of its own, not a catalog chain line."""

    def __init__(self, price: Any) -> None:
        self.price = price

    @hookimpl(tryfirst=True)
    def prism_select_route(self, call: Any, model: Any) -> Any:
        from prism_proxy import Binding, Route

        return Route(bindings=(Binding("alpha", "rule-line", {"price": self.price}),), name="r")


@pytest.mark.parametrize(
    ("price", "billed"),
    [(PRICE_B, expected_cost(PRICE_B, 2, 10)), ({"input": "free"}, Decimal(0))],
    ids=["priced", "badly-priced"],
)
async def test_a_line_only_a_routing_plugin_knows_is_billed_at_its_price(
    prism_fake, billing_gateway, ledger, prism_plugin, price, billed
):
    prism_plugin(RouteOwnLine(price), "test-route-own-line")
    prism_fake.script("alpha", [Fault(text=TEXT)])
    gw = await billing_gateway(priced_catalog(prism_fake, ("alpha", PRICE_A)))
    raw = await chat(gw)
    row = ledger.row(raw.headers["x-prism-request-id"])
    assert (row["upstream_model"], Ledger.cost(row)) == ("rule-line", billed)
    # A price no start-up check saw and that does not parse still leaves its row.
    assert row["unpriced"] == (billed == 0)


async def test_the_row_names_the_serving_lines_region(prism_fake, billing_gateway, ledger):
    catalog = priced_catalog(prism_fake, ("alpha", PRICE_A))
    catalog["providers"]["alpha"]["region"] = "eu-west-1"
    gw = await billing_gateway(catalog)
    raw = await chat(gw)
    assert ledger.row(raw.headers["x-prism-request-id"])["region"] == "eu-west-1"


def test_a_version_2_ledger_gains_the_region_column(tmp_path):
    from prism_billing.ledger import connect

    path = tmp_path / "old.sqlite"
    conn = connect(path)
    conn.execute("ALTER TABLE ledger DROP COLUMN region")
    conn.execute("PRAGMA user_version = 2")
    conn.close()
    conn = connect(path)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(ledger)")}
        assert "region" in columns
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    finally:
        conn.close()
