"""The rule index picks exactly the rule a linear scan would, for any mix of conditions."""

from __future__ import annotations

import random

from prism_rules.conditions import Context, compile_when
from prism_rules.rules import Rule, RuleIndex

VALUES = ["a", "b", "c", 1, 1.0, 2, True, False, None]
FIELDS = ["metadata.tier", "metadata.n", "org.name", "model", "org.tags", "key.scopes"]


def random_when(rng: random.Random) -> dict:
    field = rng.choice(FIELDS)
    names_only = field in ("org.name", "model", "org.tags", "key.scopes")
    pool = ["a", "b", "c"] if names_only else VALUES

    def one() -> object:
        shape = rng.randrange(6)
        if shape == 0:
            return rng.choice(pool)
        if shape == 1:
            return {"$eq": rng.choice(pool)}
        if shape == 2:
            return {"$in": rng.sample(pool, 2)}
        if shape == 3:
            return {"$ne": rng.choice(pool)}
        if shape == 4:
            return {"$exists": rng.choice([True, False])}
        return {"$nin": rng.sample(pool, 2)}

    when: dict = {field: one()}
    extra = rng.randrange(4)
    if extra == 1:
        when[rng.choice(FIELDS[:2])] = rng.choice(VALUES)
    elif extra == 2:
        when = {"$or": [when, {"metadata.tier": rng.choice(VALUES)}]}
    elif extra == 3:
        when = {"$and": [when, {"metadata.n": {"$in": rng.sample(VALUES, 3)}}]}
    return when


def random_context(rng: random.Random) -> Context:
    metadata = {k: rng.choice(VALUES) for k in ("tier", "n") if rng.random() < 0.7}
    return Context(
        org_name=rng.choice(["a", "b", None]),
        org_tags=frozenset(rng.sample(["a", "b", "c"], rng.randrange(3))),
        scopes=frozenset(rng.sample(["a", "b", "c"], rng.randrange(3))),
        model=rng.choice(["a", "b", "c"]),
        metadata=metadata,
    )


def test_the_index_chooses_what_a_linear_scan_chooses():
    rng = random.Random(20261130)
    for _ in range(200):
        rules = tuple(
            Rule(name=f"r{i}", when=compile_when(random_when(rng)), chain=())
            for i in range(rng.randrange(1, 30))
        )
        index = RuleIndex.of(rules)
        for _ in range(50):
            ctx = random_context(rng)
            linear = next((r for r in rules if r.when.matches(ctx)), None)
            assert index.first_match(ctx) is linear


def test_two_hundred_equality_rules_are_not_evaluated_for_a_call_that_matches_none():
    evaluated = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def matches(self, ctx):
            evaluated.append(1)
            return self.inner.matches(ctx)

    rules = tuple(
        Rule(name=f"t{i}", when=compile_when({"metadata.tenant": f"t{i}"}), chain=())
        for i in range(200)
    )
    index = RuleIndex.of(rules)
    ctx = Context(None, frozenset(), frozenset(), "m", {})
    assert index.first_match(ctx) is None
    hit = Context(None, frozenset(), frozenset(), "m", {"tenant": "t150"})
    assert index.first_match(hit).name == "t150"
    assert not index.always  # every rule is indexed
    counted = RuleIndex(
        tuple(Rule(r.name, Counting(r.when), r.chain) for r in rules), index.always, index.by_field
    )
    counted.first_match(hit)
    assert len(evaluated) == 1  # only t150 was tested
