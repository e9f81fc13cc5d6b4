"""Authorised cost: an org's max_output_price keeps dearer lines out, on every path."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import openai
import pytest
from prism_billing.authorised import parse_max_output_price

from prism_proxy import Principal, hookimpl

HI = [{"role": "user", "content": "hi"}]
DEAR = {"input": 3.0, "output": 15.0}
CHEAP = {"input": 0.5, "output": 2.0}


class OrgAuth:
    """``x-test-max-price: 10`` makes the caller an org with that max_output_price."""

    @hookimpl
    def prism_authenticate(self, call: Any) -> Principal | None:
        limit = call.request.headers.get("x-test-max-price")
        if limit is None:
            return None
        return Principal(org="acme", settings={"max_output_price": parse_max_output_price(limit)})


def catalog(fake: Any, **big: Any) -> dict:
    return {
        "providers": {
            "dear": {"kind": "openai", "base_url": fake.base_url("dear")},
            "cheap": {"kind": "openai", "base_url": fake.base_url("cheap")},
            "down": {"kind": "openai", "base_url": fake.base_url("err500")},
        },
        "models": {
            "m": {
                "chain": [
                    {"provider": "dear", "model": "big", "price": DEAR},
                    {"provider": "cheap", "model": "small", "price": CHEAP},
                ]
            },
            "premium": {
                "tier": "premium",
                "retries": 0,
                "chain": [{"provider": "down", "model": "x", "price": CHEAP}],
                "fallback_models": ["dear-only"],
                "cross_tier_fallback": True,
            },
            "dear-only": {"chain": [{"provider": "dear", "model": "big2", "price": DEAR}]},
        },
    }


async def start(prism_gateway: Any, prism_fake: Any) -> Any:
    return await prism_gateway(
        catalog(prism_fake),
        plugins=[(OrgAuth(), "test-org-auth")],
        load_plugins=["openai", "billing"],
    )


async def test_a_line_above_the_orgs_price_is_skipped(prism_fake, prism_gateway):
    gw = await start(prism_gateway, prism_fake)
    client = gw.openai(default_headers={"x-test-max-price": "10"})
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
    assert raw.headers["x-prism-provider"] == "cheap"
    log = raw.headers["x-prism-attempt-log"]
    assert log.startswith("dear/big skipped price: output 15.0 per million > max_output_price 10")
    assert prism_fake.hits("dear") == 0
    # An org without the setting, or a higher one, may use the dear line.
    open_raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
    assert open_raw.headers["x-prism-provider"] == "dear"
    rich = gw.openai(default_headers={"x-test-max-price": "20"})
    assert (await rich.chat.completions.with_raw_response.create(model="m", messages=HI)).headers[
        "x-prism-provider"
    ] == "dear"


async def test_a_cross_tier_fallback_above_the_price_is_never_tried(prism_fake, prism_gateway):
    gw = await start(prism_gateway, prism_fake)
    client = gw.openai(default_headers={"x-test-max-price": "10"})
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="premium", messages=HI)
    assert info.value.status_code == 503
    assert prism_fake.hits("dear") == 0
    reasons = [entry["reason"] for entry in info.value.body["attempts"]]
    assert any(reason.startswith("price: output 15.0") for reason in reasons)


@pytest.mark.parametrize(
    ("text", "value"), [("10", Decimal(10)), (" 0.25 ", Decimal("0.25")), ("0", Decimal(0))]
)
def test_the_setting_parses_a_price(text, value):
    assert parse_max_output_price(text) == value


@pytest.mark.parametrize("text", ["ten", "-1", "NaN", "Infinity", "2000000"])
def test_the_setting_refuses_what_is_not_a_price(text):
    with pytest.raises(ValueError, match="price"):
        parse_max_output_price(text)
