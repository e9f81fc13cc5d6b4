"""Conditional routing through the real gateway, against the fake upstream."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from prism_proxy import Principal, hookimpl

MESSAGES = [{"role": "user", "content": "hello"}]


class HeaderAuth:
    """A stand-in auth plugin: the caller's org, tags and scopes come from test headers."""

    @hookimpl
    def prism_authenticate(self, call):
        request = call.request
        org = request.headers.get("x-test-org")
        if org is None:
            return None

        def names(header: str) -> frozenset[str]:
            return frozenset(filter(None, request.headers.get(header, "").split(",")))

        return Principal(
            key_id="k1", org=org, org_tags=names("x-test-tags"), scopes=names("x-test-scopes")
        )


@pytest.fixture(autouse=True)
def header_auth(prism_plugin):
    prism_plugin(HeaderAuth(), "test-header-auth")


def providers(fake, *names: str) -> dict:
    return {name: {"kind": "openai", "base_url": fake.base_url(name)} for name in names}


def line(provider: str) -> dict:
    return {"provider": provider, "model": f"up-{provider}"}


async def post(gw, body: dict, headers: dict[str, str] | None = None):
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"messages": MESSAGES, **body},
            headers=headers or {},
        ) as response:
            return response.status, response.headers, await response.json()


async def test_rules_match_each_context_source(prism_fake, prism_gateway):
    catalog = {
        "providers": providers(prism_fake, "us", "eu", "gold", "labs", "meta"),
        "models": {
            "chat-a": {
                "chain": [line("us")],
                "rules": [
                    {"name": "eu-orgs", "when": {"org.tags": "eu"}, "chain": [line("eu")]},
                    {
                        "name": "gold-keys",
                        "when": {"key.scopes": "tier:gold"},
                        "chain": [line("gold")],
                    },
                    {"name": "acme", "when": {"org.name": "acme"}, "chain": [line("labs")]},
                    {
                        "name": "big-batch",
                        "when": {"metadata.batch": {"$gte": 100}, "metadata.region": "eu"},
                        "chain": [line("meta")],
                    },
                ],
            },
        },
    }
    gw = await prism_gateway(catalog)

    async def served_by(headers: dict[str, str], metadata: dict | None = None) -> tuple[str, str]:
        body = (
            {"model": "chat-a"} if metadata is None else {"model": "chat-a", "metadata": metadata}
        )
        status, response_headers, _ = await post(gw, body, headers)
        assert status == 200
        return response_headers["x-prism-provider"], response_headers.get("x-prism-route", "-")

    assert await served_by({}) == ("us", "-")
    assert await served_by({"x-test-org": "o", "x-test-tags": "eu,gold"}) == ("eu", "eu-orgs")
    assert await served_by({"x-test-org": "o", "x-test-scopes": "chat,tier:gold"}) == (
        "gold",
        "gold-keys",
    )
    assert await served_by({"x-test-org": "acme"}) == ("labs", "acme")
    assert await served_by({}, {"batch": 500, "region": "eu"}) == ("meta", "big-batch")
    header = {"x-prism-metadata": json.dumps({"batch": 100, "region": "eu"})}
    assert await served_by(header) == ("meta", "big-batch")
    # The body's metadata wins over the header's, key by key.
    assert await served_by(header, {"batch": 99}) == ("us", "-")
    assert await served_by({}, {"batch": "500", "region": "eu"}) == ("us", "-")  # typed


async def test_model_id_is_the_model_the_caller_asked_for(prism_fake, prism_gateway):
    catalog = {
        "providers": providers(prism_fake, "err500", "us", "backup"),
        "models": {
            "premium": {
                "chain": [line("err500")],
                "retries": 0,
                "fallback_models": ["basic"],
                "cross_tier_fallback": True,
            },
            "basic": {
                "tier": "economy",
                "chain": [line("us")],
                "rules": [
                    {
                        "name": "premium-overflow",
                        "when": {"model": "premium"},
                        "chain": [line("backup")],
                    }
                ],
            },
        },
    }
    gw = await prism_gateway(catalog)
    client = gw.openai()
    direct = await client.chat.completions.with_raw_response.create(
        model="basic", messages=MESSAGES
    )
    assert direct.headers["x-prism-provider"] == "us"
    overflow = await client.chat.completions.with_raw_response.create(
        model="premium", messages=MESSAGES
    )
    assert overflow.headers["x-prism-provider"] == "backup"
    assert prism_fake.hits("us") == 1


async def test_first_matching_rule_wins(prism_fake, prism_gateway):
    catalog = {
        "providers": providers(prism_fake, "us", "eu-a", "eu-b"),
        "models": {
            "chat-a": {
                "chain": [line("us")],
                "rules": [
                    {"name": "eu-orgs", "when": {"org.tags": "eu"}, "chain": [line("eu-a")]},
                    {
                        "name": "eu-callers",
                        "when": {"metadata.region": "eu"},
                        "chain": [line("eu-b")],
                    },
                ],
            }
        },
    }
    gw = await prism_gateway(catalog)
    both = {"x-test-org": "o", "x-test-tags": "eu"}
    _, headers, _ = await post(gw, {"model": "chat-a", "metadata": {"region": "eu"}}, both)
    assert (headers["x-prism-provider"], headers["x-prism-route"]) == ("eu-a", "eu-orgs")
    _, headers, _ = await post(gw, {"model": "chat-a", "metadata": {"region": "eu"}})
    assert (headers["x-prism-provider"], headers["x-prism-route"]) == ("eu-b", "eu-callers")
    assert prism_fake.hits("us") == 0


def pinned_catalog(fake) -> dict:
    return {
        "providers": {
            "eu": {"kind": "openai", "base_url": fake.base_url("err500")},
            "us": {"kind": "openai", "base_url": fake.base_url("us")},
            "cheap": {"kind": "openai", "base_url": fake.base_url("cheap")},
        },
        "models": {
            "chat-a": {
                "chain": [line("eu"), line("us")],
                "retries": 1,
                "fallback_models": ["chat-b"],
                "cross_tier_fallback": True,
                "rules": [
                    {"name": "eu-pinned", "when": {"metadata.region": "eu"}, "chain": [line("eu")]}
                ],
            },
            "chat-b": {"tier": "economy", "chain": [line("cheap")]},
        },
    }


async def test_a_region_pinned_chain_returns_503_rather_than_leave_its_region(
    prism_fake, prism_gateway
):
    async def no_wait(seconds: float) -> None:
        return None

    gw = await prism_gateway(pinned_catalog(prism_fake), sleep=no_wait)
    status, headers, body = await post(gw, {"model": "chat-a", "metadata": {"region": "eu"}})
    assert status == 503
    assert headers["x-prism-route"] == "eu-pinned"
    assert headers["x-prism-provider"] == "eu"
    assert [a["binding"] for a in body["error"]["attempts"]] == ["eu/up-eu", "eu/up-eu"]
    assert prism_fake.hits("us") == 0 and prism_fake.hits("cheap") == 0

    # Without the rule, the same failure falls back as usual.
    status, headers, _ = await post(gw, {"model": "chat-a"})
    assert status == 200 and headers["x-prism-provider"] == "us"
    assert "x-prism-route" not in headers


async def test_metadata_cannot_steer_to_a_provider_the_rule_does_not_name(
    prism_fake, prism_gateway
):
    async def no_wait(seconds: float) -> None:
        return None

    gw = await prism_gateway(pinned_catalog(prism_fake), sleep=no_wait)
    steering = {
        "region": "eu",
        "provider": "us",
        "binding": "us/up-us",
        "model": "chat-b",
        "chain": "cheap/up-cheap",
        "route": "default",
    }
    header = {"x-prism-metadata": json.dumps({"provider": "cheap", "fallback": "us"})}
    status, headers, _ = await post(gw, {"model": "chat-a", "metadata": steering}, header)
    assert status == 503 and headers["x-prism-provider"] == "eu"
    assert prism_fake.hits("us") == 0 and prism_fake.hits("cheap") == 0

    # Nor can metadata pose as the context the operator controls.
    tagged = {
        "providers": providers(prism_fake, "us", "eu"),
        "models": {
            "chat-a": {
                "chain": [line("us")],
                "rules": [{"name": "eu-orgs", "when": {"org.tags": "eu"}, "chain": [line("eu")]}],
            }
        },
    }
    gw = await prism_gateway(tagged)
    fake_context = {"org.tags": "eu", "tags": "eu", "org": "eu"}
    status, headers, _ = await post(gw, {"model": "chat-a", "metadata": fake_context})
    assert status == 200 and headers["x-prism-provider"] == "us"


async def test_ne_holds_on_a_missing_key_and_missing_never_equals_null(prism_fake, prism_gateway):
    catalog = {
        "providers": providers(prism_fake, "us", "paid", "nulls"),
        "models": {
            "chat-a": {
                "chain": [line("us")],
                "rules": [
                    {
                        "name": "plan-null",
                        "when": {"metadata.plan": None},
                        "chain": [line("nulls")],
                    },
                    {
                        "name": "not-free",
                        "when": {"metadata.plan": {"$ne": "free"}},
                        "chain": [line("paid")],
                    },
                ],
            }
        },
    }
    gw = await prism_gateway(catalog)

    async def provider(metadata: dict | None) -> str:
        body = (
            {"model": "chat-a"} if metadata is None else {"model": "chat-a", "metadata": metadata}
        )
        status, headers, _ = await post(gw, body)
        assert status == 200
        return headers["x-prism-provider"]

    assert await provider(None) == "paid"  # missing: not null, and $ne "free" holds
    assert await provider({"other": 1}) == "paid"
    assert await provider({"plan": "free"}) == "us"
    assert await provider({"plan": "pro"}) == "paid"
    assert await provider({"plan": None}) == "nulls"


@pytest.mark.parametrize(
    ("headers", "metadata", "code", "param"),
    [
        ({"x-prism-metadata": "{not json"}, None, "metadata_invalid_json", "x-prism-metadata"),
        ({"x-prism-metadata": '["eu"]'}, None, "metadata_not_object", "x-prism-metadata"),
        ({"x-prism-metadata": '"eu"'}, None, "metadata_not_object", "x-prism-metadata"),
        (
            {"x-prism-metadata": json.dumps({"k": "x" * 4100})},
            None,
            "metadata_too_large",
            "x-prism-metadata",
        ),
        (
            {"x-prism-metadata": json.dumps({f"k{i}": i for i in range(33)})},
            None,
            "metadata_too_many_values",
            "x-prism-metadata",
        ),
        (
            {"x-prism-metadata": json.dumps({"nested": {"a": 1}})},
            None,
            "metadata_invalid_value",
            "x-prism-metadata",
        ),
        ({}, {"tags": ["a", "b"]}, "metadata_invalid_value", "metadata"),
        ({}, {f"k{i}": i for i in range(33)}, "metadata_too_many_values", "metadata"),
        (
            {"x-prism-metadata": json.dumps({f"h{i}": i for i in range(20)})},
            {f"b{i}": i for i in range(13)},
            "metadata_too_many_values",
            "metadata",
        ),
        (
            {"x-prism-metadata": json.dumps({"a": "x" * 2500})},
            {"b": "y" * 2500},
            "metadata_too_large",
            "metadata",
        ),
    ],
)
async def test_metadata_limits(prism_fake, prism_gateway, headers, metadata, code, param):
    gw = await prism_gateway(
        {"providers": providers(prism_fake, "us"), "models": {"chat-a": {"chain": [line("us")]}}}
    )
    body = {"model": "chat-a"} if metadata is None else {"model": "chat-a", "metadata": metadata}
    status, _, answer = await post(gw, body, headers)
    assert status == 400
    assert answer["error"]["code"] == code
    assert answer["error"]["param"] == param
    assert param in answer["error"]["message"] or "'metadata'" in answer["error"]["message"]
    assert prism_fake.hits("us") == 0


async def test_metadata_at_the_limits_is_accepted(prism_fake, prism_gateway):
    gw = await prism_gateway(
        {"providers": providers(prism_fake, "us"), "models": {"chat-a": {"chain": [line("us")]}}}
    )
    client = gw.openai()
    header = {f"h{i}": i for i in range(16)}
    answer = await client.chat.completions.with_raw_response.create(
        model="chat-a",
        messages=MESSAGES,
        metadata={f"b{i}": str(i) for i in range(16)},
        extra_headers={"x-prism-metadata": json.dumps(header)},
    )
    assert answer.http_response.status_code == 200
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="chat-a",
            messages=MESSAGES,
            metadata={f"b{i}": str(i) for i in range(17)},
            extra_headers={"x-prism-metadata": json.dumps(header)},
        )
    assert refused.value.code == "metadata_too_many_values"
