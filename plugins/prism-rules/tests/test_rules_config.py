"""Rules are checked at start-up, and the condition language means what the README says."""

from __future__ import annotations

import re

import pytest
from prism_rules import ConditionError, Context, compile_when

from prism_proxy import GATEWAY, CatalogKeys, ConfigError, config_from_mapping, create_app, hookimpl


def catalog(rules: list, **extra_models: dict) -> dict:
    return {
        "providers": {
            "us": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"},
            "eu": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"},
        },
        "models": {
            "chat-a": {"chain": [{"provider": "us", "model": "up"}], "rules": rules},
            **extra_models,
        },
    }


def start(data: dict) -> None:
    create_app(config_from_mapping({}, catalog_data=data, source="prism.ini"))


EU = [{"provider": "eu", "model": "gpt-eu"}]


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [
                {"name": "ok", "chain": EU},
                {"name": "eu-only", "when": {"metadata.region": {"$regex": "^eu"}}, "chain": EU},
            ],
            "models.chat-a.rules[1] (eu-only): "
            "when.metadata.region.$regex: unknown operator $regex",
        ),
        (
            [{"name": "eu-only", "chain": [{"provider": "azure-eu", "model": "gpt-4o"}]}],
            "models.chat-a.rules[0] (eu-only): chain[0].provider: unknown provider 'azure-eu'",
        ),
        (
            [{"name": "r", "when": {"$nor": [{"model": "x"}]}, "chain": EU}],
            "rules[0] (r): when.$nor: unknown operator $nor",
        ),
        (
            [{"name": "r", "when": {"org.tag": "eu"}, "chain": EU}],
            "rules[0] (r): when.org.tag: unknown field 'org.tag'",
        ),
        (
            [{"name": "r", "when": {"org.tags": {"$gt": 1}}, "chain": EU}],
            "$gt compares numbers; this field holds names",
        ),
        (
            [{"name": "r", "when": {"metadata.region": ["eu", "de"]}, "chain": EU}],
            "a list is not a value: use { $in = [...] }",
        ),
        (
            [{"name": "r", "when": {"metadata.n": {"$in": []}}, "chain": EU}],
            "when.metadata.n.$in: expected a non-empty list",
        ),
        ([{"name": "default", "chain": EU}], "rules[0].name: expected a name"),
        ([{"name": "a b", "chain": EU}], "rules[0].name: expected a name"),
        (
            [{"name": "r", "chain": EU}, {"name": "r", "chain": EU}],
            "rules[1] (r): another rule of chat-a is named 'r'",
        ),
        ([{"name": "r", "chain": []}], "rules[0] (r): chain: missing or empty"),
        ([{"name": "r", "chain": EU, "then": "x"}], "rules[0] (r): unknown key 'then'"),
        (
            [{"name": "r", "chain": [{"provider": "us", "model": "up", "price": 1}]}],
            "us/up is a catalog binding already; set price on its catalog chain line",
        ),
        ({"name": "r"}, "models.chat-a.rules: expected a list of rule tables"),
    ],
)
def test_rule_mistakes_stop_start_up_naming_the_rule(rules, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        start(catalog(rules))


class RegionKey:
    """Another plugin's declared chain-line key."""

    @hookimpl
    def prism_catalog_keys(self):
        return CatalogKeys(binding=frozenset({"region"}))


def test_rule_chain_lines_reuse_catalog_lines_and_take_only_declared_keys():
    lines = [
        {"provider": "eu", "model": "gpt-eu", "region": "eu-west"},
        {"provider": "us", "model": "up"},
    ]
    data = catalog([{"name": "r", "chain": lines}])
    app = create_app(
        config_from_mapping({}, catalog_data=data, source="prism.ini"),
        plugins=[(RegionKey(), "test-region-key")],
    )
    rule = app[GATEWAY].current.plugin("rules.book").book.by_model["chat-a"][0]
    assert rule.chain[0].options == {"region": "eu-west"}
    # The very line object of the catalog: prices and breakers keyed on it agree.
    assert rule.chain[1] is app[GATEWAY].current.catalog.models["chat-a"].chain[0]

    lines[0] = {"provider": "eu", "model": "gpt-eu", "regoin": "eu-west"}
    with pytest.raises(ConfigError, match=r"rules\[0\] \(r\): chain\[0\]\.regoin: unknown key"):
        create_app(
            config_from_mapping({}, catalog_data=catalog([{"name": "r", "chain": lines}])),
            plugins=[(RegionKey(), "test-region-key")],
        )


def test_rules_section_takes_no_keys():
    with pytest.raises(ConfigError, match=r"\[prism:rules\] metadata_max: unknown key"):
        create_app(
            config_from_mapping(
                {}, {"rules": {"metadata_max": "1"}}, catalog_data=catalog([]), source="x"
            )
        )


def ctx(**metadata: object) -> Context:
    return Context(
        org_name=None,
        org_tags=frozenset({"eu", "gold"}),
        scopes=frozenset({"chat"}),
        model="chat-a",
        metadata=metadata,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("when", "holds", "fails"),
    [
        ({"metadata.n": 1}, [ctx(n=1), ctx(n=1.0)], [ctx(n=True), ctx(n="1"), ctx()]),
        ({"metadata.b": True}, [ctx(b=True)], [ctx(b=1), ctx()]),
        ({"metadata.x": None}, [ctx(x=None)], [ctx(), ctx(x=0), ctx(x="")]),
        ({"metadata.x": {"$ne": None}}, [ctx(), ctx(x=0)], [ctx(x=None)]),
        ({"metadata.r": {"$in": ["eu", "de"]}}, [ctx(r="de")], [ctx(r="us"), ctx()]),
        ({"metadata.r": {"$nin": ["eu", "de"]}}, [ctx(r="us"), ctx()], [ctx(r="eu")]),
        ({"metadata.r": {"$exists": True}}, [ctx(r=None), ctx(r="x")], [ctx()]),
        ({"metadata.r": {"$exists": False}}, [ctx()], [ctx(r=None)]),
        (
            {"metadata.n": {"$gt": 2, "$lte": 5}},
            [ctx(n=3), ctx(n=5)],
            [ctx(n=2), ctx(n="3"), ctx()],
        ),
        ({"metadata.n": {"$gte": 2, "$lt": 2.5}}, [ctx(n=2)], [ctx(n=2.5), ctx(n=True)]),
        ({"metadata.n": {"$not": {"$gt": 2}}}, [ctx(n=1), ctx()], [ctx(n=3)]),
        ({"org.tags": "eu"}, [ctx()], []),
        ({"org.tags": {"$ne": "eu"}}, [], [ctx()]),
        ({"org.tags": {"$in": ["us", "gold"]}}, [ctx()], []),
        ({"org.tags": {"$nin": ["us", "gold"]}}, [], [ctx()]),
        ({"org.tags": {"$exists": True}, "key.scopes": "chat"}, [ctx()], []),
        ({"org.name": {"$exists": False}}, [ctx()], []),
        ({"org.name": {"$ne": "acme"}}, [ctx()], []),
        ({"model": {"$in": ["chat-a", "chat-b"]}}, [ctx()], []),
        ({"$or": [{"metadata.a": 1}, {"metadata.b": 2}]}, [ctx(a=1), ctx(b=2)], [ctx(a=2)]),
        ({"$and": [{"metadata.a": 1}, {"metadata.b": 2}]}, [ctx(a=1, b=2)], [ctx(a=1)]),
        ({"$not": {"metadata.a": 1}}, [ctx(), ctx(a=2)], [ctx(a=1)]),
        ({}, [ctx()], []),
    ],
)
def test_condition_semantics(when, holds, fails):
    condition = compile_when(when)
    assert [condition.matches(c) for c in holds] == [True] * len(holds)
    assert [condition.matches(c) for c in fails] == [False] * len(fails)


def test_condition_errors_name_the_path():
    with pytest.raises(ConditionError, match=r"when\.\$or\[1\]\.metadata\.a\.\$like: unknown"):
        compile_when({"$or": [{"metadata.a": 1}, {"metadata.a": {"$like": "x"}}]})
    with pytest.raises(ConditionError, match=r"\$gt needs a finite number"):
        compile_when({"metadata.a": {"$gt": float("nan")}})
    with pytest.raises(ConditionError, match=r"\$exists: expected true or false"):
        compile_when({"metadata.a": {"$exists": 1}})
