"""Regions through the real gateway, against the fake upstream.

The fake upstream's hit counts are what a provider in the wrong region would
have seen: every test asserts it saw nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from prism_fake_upstream import Fault
from prism_regions import POLICY_NAME, RegionPolicy, policy_of

from prism_proxy import Binding, Call, ModelSpec, Principal, Route, Settlement, hookimpl

EU = "eu-west-1"
EU_BOTH = "eu-west-1,eu-central-1"


async def test_an_eu_org_is_served_by_the_eu_line_although_the_us_line_is_first(
    kit, start, prism_fake
):
    gw = await start(kit.catalog("us", "eu"))
    answer = await kit.chat(gw, org="acme", org_regions=EU_BOTH)
    assert answer.status == 200
    assert (answer.provider, answer.region) == ("eu", "eu-west-1")
    assert answer.steps == [kit.skipped("us"), "eu/up-eu ok 200"]
    assert prism_fake.hits("us") == 0
    # An organisation without the setting, or with an empty one, is unrestricted;
    # so is a caller without an organisation when there is no default.
    for caller in ({"org": "globex"}, {"org": "initech", "org_regions": ""}, {}):
        other = await kit.chat(gw, **caller)
        assert (other.status, other.provider, other.region) == (200, "us", "us-east-1"), caller
        assert other.steps == ["us/up-us ok 200"]


async def test_a_stream_is_routed_the_same_way(kit, start, prism_fake):
    gw = await start(kit.catalog("us", "eu"))
    answer = await kit.chat(gw, org="acme", org_regions=EU, stream=True)
    assert answer.status == 200
    assert (answer.provider, answer.region) == ("eu", "eu-west-1")
    assert b"data: [DONE]" in answer.body
    assert prism_fake.hits("us") == 0


async def test_pinning_a_line_outside_the_allowed_regions_is_403_and_never_sent(
    kit, start, prism_fake
):
    gw = await start(kit.catalog("us", "eu", "de"))
    answer = await kit.chat(gw, "us/up-us", org="acme", org_regions=EU_BOTH)
    assert answer.status == 403
    error = answer.body["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "region_not_allowed",
        "model",
        "permission_error",
    )
    assert "us-east-1" in error["message"]
    assert "eu-central-1, eu-west-1" in error["message"]
    assert answer.headers["x-prism-attempts"] == "0"
    assert prism_fake.hits("us") == 0
    # A line inside them is served; the header narrows pinned calls too.
    inside = await kit.chat(gw, "eu/up-eu", org="acme", org_regions=EU_BOTH)
    assert (inside.status, inside.provider) == (200, "eu")
    narrowed = await kit.chat(
        gw, "eu/up-eu", org="acme", org_regions=EU_BOTH, regions="eu-central-1"
    )
    assert narrowed.status == 403 and narrowed.code == "region_not_allowed"
    assert prism_fake.hits("eu") == 1
    # Unrestricted callers pin whatever they like.
    free = await kit.chat(gw, "us/up-us", org="globex")
    assert (free.status, free.provider) == (200, "us")


async def test_a_rule_chain_is_filtered(kit, start, prism_fake):
    cat = kit.catalog("eu")
    cat["models"]["m"]["rules"] = [
        {
            "name": "everyone",
            "chain": [
                {"provider": "us", "model": "up-fast"},
                # A line's own region wins over its provider's (none here).
                {"provider": "plain", "model": "up-west", "region": "us-west-2"},
                {"provider": "de", "model": "up-de"},
            ],
        }
    ]
    gw = await start(cat, plugins=["rules"])
    answer = await kit.chat(gw, org="acme", org_regions=EU_BOTH)
    assert answer.status == 200 and answer.headers["x-prism-route"] == "everyone"
    assert (answer.provider, answer.region) == ("de", "eu-central-1")
    assert answer.steps == [
        kit.skipped("us", "up-fast"),
        "plain/up-west skipped region: us-west-2 not allowed",
        "de/up-de ok 200",
    ]
    # Nothing of the rule in the allowed regions: 503 with the record, never the
    # model's own EU line (a rule replaces the chain, fallbacks included).
    only_eu = await kit.chat(gw, org="acme", org_regions=EU)
    assert only_eu.status == 503 and only_eu.code == "no_binding_available"
    assert only_eu.steps == [
        kit.skipped("us", "up-fast"),
        "plain/up-west skipped region: us-west-2 not allowed",
        kit.skipped("de"),
        "note regions: no line left in eu-west-1",
    ]
    assert prism_fake.hits("us") == prism_fake.hits("plain") == prism_fake.hits("eu") == 0
    free = await kit.chat(gw, org="globex")
    assert (free.provider, free.region) == ("us", "us-east-1")


def fallback_catalog(kit: Any) -> dict[str, Any]:
    cat = kit.catalog("us")
    cat["models"] = {
        "big": {
            "tier": "premium",
            "chain": [{"provider": "us", "model": "up-big"}],
            "fallback_models": ["small"],
            "cross_tier_fallback": True,
        },
        "small": {
            "tier": "economy",
            "chain": [
                {"provider": "us", "model": "up-small"},
                {"provider": "eu", "model": "up-small"},
            ],
        },
    }
    return cat


async def test_cross_tier_fallback_models_are_filtered(kit, start, prism_fake):
    gw = await start(fallback_catalog(kit))
    answer = await kit.chat(gw, "big", org="acme", org_regions=EU)
    assert answer.status == 200
    assert answer.headers["x-prism-fallback"] == "cross-tier"
    assert (answer.provider, answer.headers["x-prism-model"], answer.region) == (
        "eu",
        "up-small",
        "eu-west-1",
    )
    assert answer.steps == [
        kit.skipped("us", "up-big"),
        "note regions: no line left in eu-west-1",
        "note cross-tier fallback to small (tier economy)",
        kit.skipped("us", "up-small"),
        "eu/up-small ok 200",
    ]
    # A fallback with nothing in the allowed regions either: 503 with the record.
    nowhere = await kit.chat(gw, "big", org="acme", org_regions="eu-central-1")
    assert nowhere.status == 503 and nowhere.code == "no_binding_available"
    assert [a["reason"] for a in nowhere.body["error"]["attempts"] if "binding" in a] == [
        "region: us-east-1 not allowed",
        "region: us-east-1 not allowed",
        "region: eu-west-1 not allowed",
    ]
    assert prism_fake.hits("us") == 0


async def test_the_breaker_never_sends_a_call_out_of_its_regions(kit, start, prism_fake):
    prism_fake.script("eu", [Fault(status=500)])  # then healthy again
    gw = await start(
        kit.catalog("eu", "us"),
        plugins=["breaker"],
        sections={"breaker": {"consecutive_failures": 1}},
    )
    tripped = await kit.chat(gw, org="acme", org_regions=EU)
    assert tripped.status == 503
    assert tripped.steps == [
        kit.skipped("us"),
        "eu/up-eu transient 500",
        "eu/up-eu vetoed breaker: isolated",
    ]
    assert tripped.region == "eu-west-1"  # the line tried last
    # The breaker skips the isolated EU line and would send the call to the US
    # line: the region filter runs outside it and takes that away.
    isolated = await kit.chat(gw, org="acme", org_regions=EU)
    assert isolated.status == 503 and isolated.code == "no_binding_available"
    assert isolated.steps == [
        "eu/up-eu skipped breaker: isolated",
        kit.skipped("us"),
        "note regions: no line left in eu-west-1",
    ]
    assert [(a.get("binding"), a["reason"]) for a in isolated.body["error"]["attempts"]] == [
        ("eu/up-eu", "breaker: isolated"),
        ("us/up-us", "region: us-east-1 not allowed"),
        (None, "regions: no line left in eu-west-1"),
    ]
    assert prism_fake.hits("us") == 0
    # Meanwhile an unrestricted caller is served by the US line.
    free = await kit.chat(gw, org="globex")
    assert (free.status, free.provider) == (200, "us")
    # Trip the US line too: everything is out and the breaker stands down,
    # trying the whole chain; the EU org still reaches only the EU line.
    prism_fake.script("us", [Fault(status=500)])
    assert (await kit.chat(gw, org="globex")).status == 503
    assert prism_fake.hits("us") == 2
    down = await kit.chat(gw, org="acme", org_regions=EU)
    assert down.headers["x-prism-breaker"] == "stand-down"
    assert (down.status, down.provider, down.region) == (200, "eu", "eu-west-1")
    assert down.steps == [
        kit.skipped("us"),
        "note breaker: every binding is out, standing down, trying them all",
        "eu/up-eu ok 200",
    ]
    assert prism_fake.hits("us") == 2


async def test_retries_stay_on_the_allowed_line(kit, start, prism_fake):
    prism_fake.script("eu", [Fault(status=500)] * 2)
    gw = await start(kit.catalog("eu", "us"))
    answer = await kit.chat(gw, org="acme", org_regions=EU)
    assert (answer.status, answer.provider) == (200, "eu")
    assert answer.steps == [kit.skipped("us")] + ["eu/up-eu transient 500"] * 2 + [
        "eu/up-eu ok 200"
    ]
    prism_fake.script("eu", [Fault(status=500)] * 3)
    spent = await kit.chat(gw, org="acme", org_regions=EU)
    assert spent.status == 503 and spent.code == "upstream_unavailable"
    assert spent.steps == [kit.skipped("us")] + ["eu/up-eu transient 500"] * 3
    assert (spent.provider, spent.region) == ("eu", "eu-west-1")
    assert spent.body["error"]["attempts"][0] == {
        "outcome": "skipped",
        "reason": "region: us-east-1 not allowed",
        "binding": "us/up-us",
    }
    assert prism_fake.hits("us") == 0


class PutBack:
    """A route wrapper that runs outside the region filter and puts a line back first."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding

    @hookimpl(wrapper=True, tryfirst=True)
    def prism_select_route(self, call: Call, model: ModelSpec) -> Any:
        route: Route | None = yield
        if route is not None:
            route.bindings = (self.binding, *route.bindings)
        return route


async def test_the_veto_stops_a_line_a_later_wrapper_puts_back(kit, start, prism_fake):
    gw = await start(kit.catalog("eu", "us"))
    generation = gw.gateway.current
    # Registered after the region policy: its tryfirst wrapper is the outermost.
    generation.register(PutBack(generation.catalog.bindings["us/up-us"]), "test.put-back")
    answer = await kit.chat(gw, org="acme", org_regions=EU)
    assert (answer.status, answer.provider) == (200, "eu")
    assert answer.steps == [
        kit.skipped("us"),
        kit.skipped("us", kind="vetoed"),
        "eu/up-eu ok 200",
    ]
    assert prism_fake.hits("us") == 0


@pytest.mark.parametrize(
    ("caller", "header", "served"),
    [
        # Unrestricted callers who send the header are restricted to it.
        ({}, "eu-central-1", "de"),
        ({"org": "globex"}, "eu-west-1, eu-central-1", "eu"),
        # Restricted callers narrow ...
        ({"org": "acme", "org_regions": EU_BOTH}, "eu-central-1", "de"),
        ({"org": "acme", "org_regions": EU_BOTH}, ["eu-central-1", "us-east-1"], "de"),
        # ... and never widen: a region outside theirs is dropped from the header.
        ({"org": "acme", "org_regions": EU}, "us-east-1,eu-west-1", "eu"),
        ({"org": "acme", "org_regions": "eu-central-1"}, "us-east-1, eu-central-1", "de"),
    ],
)
async def test_the_header_narrows(kit, start, prism_fake, caller, header, served):
    gw = await start(kit.catalog("us", "eu", "de"))
    answer = await kit.chat(gw, regions=header, **caller)
    assert (answer.status, answer.provider) == (200, served)
    assert answer.region == kit.regions[served]
    assert prism_fake.hits("us") == 0


async def test_the_header_never_widens(kit, start, prism_fake):
    gw = await start(kit.catalog("us", "eu", "de"))
    answer = await kit.chat(gw, org="acme", org_regions=EU, regions="us-east-1")
    assert answer.status == 503 and answer.code == "no_binding_available"
    assert answer.steps == [
        kit.skipped("us"),
        kit.skipped("eu"),
        kit.skipped("de"),
        "note regions: no region allowed (x-prism-regions names none of the caller's regions)",
    ]
    assert answer.headers["x-prism-attempts"] == "0"
    assert "x-prism-region" not in answer.headers
    assert prism_fake.hits("us") == prism_fake.hits("eu") == prism_fake.hits("de") == 0


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("EU-WEST-1", "'EU-WEST-1' is not a region name"),
        ("eu-west-1, eu_central_1", "'eu_central_1' is not a region name"),
        ("eu west", "'eu west' is not a region name"),
        (",", "names no region"),
        ("", "names no region"),
    ],
)
async def test_a_bad_header_is_400(kit, start, prism_fake, header, problem):
    gw = await start(kit.catalog("us", "eu"))
    answer = await kit.chat(gw, org="acme", org_regions=EU, regions=header)
    assert answer.status == 400
    error = answer.body["error"]
    assert (error["code"], error["param"]) == ("invalid_region_header", "x-prism-regions")
    assert problem in error["message"]
    assert prism_fake.hits("us") == prism_fake.hits("eu") == 0


async def test_the_default_applies_to_callers_without_an_organisation(kit, start, prism_fake):
    gw = await start(kit.catalog("us", "eu", "de"), sections={"regions": {"default": EU_BOTH}})
    anonymous = await kit.chat(gw)
    assert (anonymous.status, anonymous.provider) == (200, "eu")
    assert anonymous.steps == [kit.skipped("us"), "eu/up-eu ok 200"]
    assert prism_fake.hits("us") == 0
    # An organisation is governed by its own setting, not by the default.
    assert (await kit.chat(gw, org="globex")).provider == "us"
    assert (await kit.chat(gw, org="acme", org_regions="us-east-1")).provider == "us"
    # The header narrows the default, and never widens it.
    assert (await kit.chat(gw, regions="eu-central-1")).provider == "de"
    outside = await kit.chat(gw, regions="us-east-1")
    assert outside.status == 503
    assert prism_fake.hits("us") == 2


async def test_a_line_without_a_region_is_only_for_unrestricted_callers(kit, start, prism_fake):
    gw = await start(kit.catalog("plain", "eu"))
    free = await kit.chat(gw, org="globex")
    assert (free.status, free.provider) == (200, "plain")
    assert "x-prism-region" not in free.headers
    restricted = await kit.chat(gw, org="acme", org_regions=EU)
    assert (restricted.provider, restricted.region) == ("eu", "eu-west-1")
    assert restricted.steps == [
        "plain/up-plain skipped region: none not allowed",
        "eu/up-eu ok 200",
    ]
    narrowed = await kit.chat(gw, regions=EU)
    assert narrowed.provider == "eu"
    pinned = await kit.chat(gw, "plain/up-plain", org="acme", org_regions=EU)
    assert pinned.status == 403 and pinned.code == "region_not_allowed"
    assert "no declared region" in pinned.body["error"]["message"]
    assert prism_fake.hits("plain") == 1


class Seen:
    """Observes how each call was routed: its cached regions and whether the route was touched."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, bool]] = []

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> None:
        assert call.route is not None and call.model is not None
        untouched = call.route.bindings is call.model.chain and not call.route.skipped
        self.calls.append((call.extensions.get("regions", "absent"), untouched))


async def test_unrestricted_calls_are_left_alone(kit, start, prism_plugin):
    seen = Seen()
    prism_plugin(seen, "test-seen")
    gw = await start(kit.catalog("us", "eu"))
    assert isinstance(policy_of(gw.gateway.current), RegionPolicy)
    assert gw.gateway.current.plugin(POLICY_NAME) is policy_of(gw.gateway.current)
    await kit.chat(gw)
    await kit.chat(gw, org="globex")
    await kit.chat(gw, org="acme", org_regions=EU)
    assert seen.calls == [
        (None, True),
        (None, True),
        (frozenset({"eu-west-1"}), False),
    ]


class BadSettings:
    """An auth plugin that hands over a ``regions`` value nobody can read."""

    @hookimpl
    def prism_authenticate(self, call: Call) -> Principal | None:
        if "x-test-bad" not in call.request.headers:
            return None
        return Principal(key_id="k", org="broken", settings={"regions": 42})


async def test_an_unreadable_org_setting_refuses_the_call(kit, start, prism_plugin, prism_fake):
    prism_plugin(BadSettings(), "test-bad")  # registered after the test auth: asked first
    gw = await start(kit.catalog("us", "eu"))
    answer = await kit.chat(gw, headers={"x-test-bad": "1"})
    assert answer.status == 500 and answer.code == "region_setting_invalid"
    assert prism_fake.hits("us") == prism_fake.hits("eu") == 0
