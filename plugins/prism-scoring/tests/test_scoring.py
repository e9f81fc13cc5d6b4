"""Group ordering through the real gateway, against the fake upstream.

Latency is real but small (a scripted 0.05 s stall against none); the
gateway's random is seeded, and assertions are on hit counts with margins
far wider than the draw's spread.
"""

from __future__ import annotations

import random
from typing import Any

import aiohttp
import attrs
import pytest
from prism_fake_upstream import Fault
from prism_scoring import ORDER_NAME, GroupOrder, order_of

from prism_proxy import ConfigError, config_from_mapping

MESSAGES = [{"role": "user", "content": "hello"}]
PLUGINS = ["openai", "scoring"]


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]

    @property
    def log(self) -> list[str]:
        raw = self.headers.get("x-prism-attempt-log", "")
        return raw.split("; ") if raw else []

    @property
    def tried(self) -> list[str]:
        """The bindings attempted, in order (not notes, skips or vetoes)."""
        entries = [e.split(" ") for e in self.log if not e.startswith("note ")]
        return [e[0] for e in entries if e[1] not in ("skipped", "vetoed")]

    @property
    def notes(self) -> list[str]:
        return [e for e in self.log if e.startswith("note ")]


async def chat(gw: Any, model: str = "m") -> Answer:
    payload = {"model": model, "messages": MESSAGES}
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.base_url + "/chat/completions", json=payload) as response:
            await response.read()
            return Answer(response.status, dict(response.headers))


def line(name: str, group: str | None = None, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"provider": name, "model": f"up-{name}", **extra}
    if group is not None:
        entry["group"] = group
    return entry


def catalog(fake: Any, *chain: dict[str, Any], **model: Any) -> dict[str, Any]:
    names = {entry["provider"] for entry in chain}
    return {
        "providers": {n: {"kind": "openai", "base_url": fake.base_url(n)} for n in names},
        "models": {"m": {"chain": list(chain), **model}},
    }


def order(gw: Any) -> GroupOrder:
    found = order_of(gw.gateway.current)
    assert found is not None
    return found


async def test_a_group_learns_to_send_most_calls_to_its_fast_line(prism_fake, prism_gateway):
    prism_fake.script("slow", [Fault(stall_s=0.05)] * 100)
    # Written slow first: without scoring, slow would serve every call.
    cat = catalog(prism_fake, line("slow", "g"), line("fast", "g"))
    gw = await prism_gateway(cat, load_plugins=PLUGINS, random=random.Random(7).random)
    calls = 60
    for _ in range(calls):
        answer = await chat(gw)
        assert answer.status == 200
        assert answer.tried in (["slow/up-slow"], ["fast/up-fast"])
    fast, slow = prism_fake.hits("fast"), prism_fake.hits("slow")
    assert fast + slow == calls
    # The better of two lines leads 3/4 of the calls once both are measured
    # (55% or more for 99.9% of seeds, learning included).
    assert fast >= 0.55 * calls
    # ... and the slow one is never starved: it keeps being measured.
    assert slow >= 3
    stats = order(gw).stats
    assert stats["slow/up-slow"].latency_ms > stats["fast/up-fast"].latency_ms + 30


async def test_weight_shifts_the_share(prism_fake, prism_gateway):
    prism_fake.script("slow", [Fault(stall_s=0.05)] * 100)
    cat = catalog(prism_fake, line("slow", "g"), line("fast", "g", weight=3))
    gw = await prism_gateway(cat, load_plugins=PLUGINS, random=random.Random(3).random)
    for _ in range(40):
        assert (await chat(gw)).status == 200
    # The slow line leads only when drawn twice: (1/4)^2 of the calls once measured.
    assert prism_fake.hits("fast") >= 30  # expected about 37


async def test_errors_push_a_line_down(prism_fake, prism_gateway):
    prism_fake.script("bad", [Fault(status=500)] * 100)
    cat = catalog(prism_fake, line("bad", "g"), line("good", "g"), retries=0)
    gw = await prism_gateway(cat, load_plugins=PLUGINS, random=random.Random(11).random)
    calls = 60
    first = []
    for _ in range(calls):
        answer = await chat(gw)
        assert answer.status == 200  # bad fails over to good inside the group
        first.append(answer.tried[0])
    assert first.count("good/up-good") >= 0.55 * calls  # expected about 3/4
    stats = order(gw).stats
    assert stats["bad/up-bad"].error_rate == 1.0
    assert stats["good/up-good"].error_rate == 0.0


@pytest.mark.parametrize("policy", ["fallback", "return"])
async def test_a_line_answering_empty_is_not_a_fast_line(prism_fake, prism_gateway, policy):
    # Nothing answers faster than an empty answer: counted as healthy, it would lead
    # (about 3/4 of the calls) and cost each of them an attempt, or its answer.
    prism_fake.script("hollow", [Fault(empty_length=True)] * 100)
    prism_fake.script("good", [Fault(stall_s=0.02)] * 100)
    cat = catalog(prism_fake, line("hollow", "g"), line("good", "g"), retries=0, empty=policy)
    gw = await prism_gateway(cat, load_plugins=PLUGINS, random=random.Random(7).random)
    calls = 30
    led = 0
    served_empty = "empty" if policy == "return" else None
    for _ in range(calls):
        answer = await chat(gw)
        assert answer.status == 200
        if answer.tried[0] == "hollow/up-hollow":
            led += 1
            assert answer.headers.get("x-prism-outcome") == served_empty
    # It leads only when power of two choices draws it twice (1/4), never on its score.
    assert led <= 0.4 * calls  # expected about 8 of 30
    attempts = prism_fake.hits("hollow") + prism_fake.hits("good")
    assert attempts == calls + (led if policy == "fallback" else 0)
    stats = order(gw).stats
    assert stats["hollow/up-hollow"].error_rate == 1.0
    assert stats["hollow/up-hollow"].latency_ms is None  # no answer was measured


async def test_lines_outside_the_group_keep_their_place(prism_fake, prism_gateway):
    for name in ("a", "b", "c"):
        prism_fake.script(name, [Fault(status=500)] * 100)
    cat = catalog(prism_fake, line("a"), line("b", "g"), line("c", "g"), line("d"), retries=0)
    gw = await prism_gateway(cat, load_plugins=PLUGINS, random=random.Random(5).random)
    middles = set()
    for _ in range(16):
        answer = await chat(gw)
        assert answer.status == 200
        assert answer.tried[0] == "a/up-a"
        assert answer.tried[-1] == "d/up-d"
        middle = tuple(answer.tried[1:3])
        assert sorted(middle) == ["b/up-b", "c/up-c"]
        # The attempt record shows the order used, before the attempts.
        assert answer.notes == [f"note scoring: group g order {middle[0]}, {middle[1]}"]
        assert answer.log[0].startswith("note ")
        middles.add(middle)
    assert len(middles) == 2  # both fail alike: either may lead


async def test_without_a_group_nothing_is_registered(prism_fake, prism_gateway):
    cat = catalog(prism_fake, line("a"), line("b"))
    gw = await prism_gateway(cat, load_plugins=PLUGINS, sections={"scoring": {"half_life_s": 30}})
    assert gw.gateway.current.plugin(ORDER_NAME) is None
    assert "scoring" in gw.gateway.current.loaded()
    answer = await chat(gw)
    assert answer.tried == ["a/up-a"] and answer.notes == []


async def test_an_untried_line_is_tried_and_scores_survive_a_reload(prism_fake, prism_gateway):
    prism_fake.script("slow", [Fault(stall_s=0.05)] * 100)
    cat = catalog(prism_fake, line("slow", "g"), line("fast", "g"))
    gw = await prism_gateway(cat, load_plugins=PLUGINS, random=random.Random(2).random)
    for _ in range(20):
        await chat(gw)
    before = order(gw).stats
    gateway = gw.gateway
    core = dict(gateway.current.config.core.values)  # the test's `disable` list
    # A third line joins the group; slow's URL changes (another upstream).
    cat2 = catalog(prism_fake, line("slow", "g"), line("fast", "g"), line("new", "g"))
    cat2["providers"]["slow"]["base_url"] = prism_fake.base_url("slow2")
    await gateway.reload(config_from_mapping(core, catalog_data=cat2))
    after = order(gw).stats
    assert after["fast/up-fast"] is before["fast/up-fast"]  # kept: same line
    assert after["slow/up-slow"] is not before["slow/up-slow"]  # changed line: afresh
    assert after["slow/up-slow"].latency_ms is None
    assert after["new/up-new"].latency_ms is None
    for _ in range(30):
        assert (await chat(gw)).status == 200
    # Neutral until measured: the new line (and the changed one) get tried.
    assert prism_fake.hits("new") >= 1
    assert prism_fake.hits("slow2") >= 1


async def test_the_breaker_skips_and_scoring_orders_what_is_left(prism_fake, prism_gateway):
    prism_fake.script("dead", [Fault(status=500)] * 100)
    cat = catalog(prism_fake, line("dead", "g"), line("b", "g"), line("c", "g"), retries=0)
    gw = await prism_gateway(
        cat,
        load_plugins=[*PLUGINS, "breaker"],
        sections={"breaker": {"consecutive_failures": 1}},
        random=random.Random(9).random,
    )
    seen_skip = False
    for _ in range(20):
        answer = await chat(gw)
        assert answer.status == 200
        if "dead/up-dead skipped breaker: isolated" in answer.log:
            seen_skip = True
            assert "dead/up-dead" not in answer.tried
            (note,) = answer.notes
            assert "dead" not in note and "group g order" in note
    assert seen_skip
    assert prism_fake.hits("dead") == 1


@pytest.mark.parametrize(
    ("chain", "key", "problem"),
    [
        (
            [line("a", "g"), line("b"), line("c", "g")],
            "models.m.chain[2].group",
            "group 'g' is interrupted at chain[1]",
        ),
        (
            [line("a", "g"), line("b", "h"), line("c", "g")],
            "models.m.chain[2].group",
            "group 'g' is interrupted at chain[1]",
        ),
        ([line("a", weight=2)], "models.m.chain[0].weight", "weight without a group"),
        ([line("a", "g", weight=0)], "models.m.chain[0].weight", "expected a positive number"),
        ([line("a", "g", weight=-1.5)], "models.m.chain[0].weight", "positive number"),
        ([line("a", "g", weight="2")], "models.m.chain[0].weight", "positive number"),
        ([line("a", "g", weight=True)], "models.m.chain[0].weight", "positive number"),
        ([line("a", "g", weight=float("inf"))], "models.m.chain[0].weight", "positive number"),
        ([line("a", "")], "models.m.chain[0].group", "expected a name"),
        ([line("a", 3)], "models.m.chain[0].group", "expected a name"),
        ([line("a", "two words")], "models.m.chain[0].group", "expected a name"),
    ],
)
async def test_catalog_mistakes_stop_start_up(prism_fake, prism_gateway, chain, key, problem):
    with pytest.raises(ConfigError) as caught:
        await prism_gateway(catalog(prism_fake, *chain), load_plugins=PLUGINS)
    assert caught.value.key == key
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("values", "key", "problem"),
    [
        ({"half_life": 60}, "[prism:scoring] half_life", "unknown key"),
        ({"half_life_s": 0}, "[prism:scoring] half_life_s", "at least 1"),
        ({"half_life_s": "soon"}, "[prism:scoring] half_life_s", "expected a number"),
        ({"error_penalty_ms": -1}, "[prism:scoring] error_penalty_ms", "at least 0"),
        ({"error_penalty_ms": "nan"}, "[prism:scoring] error_penalty_ms", "finite"),
    ],
)
async def test_setting_mistakes_stop_start_up(prism_fake, prism_gateway, values, key, problem):
    with pytest.raises(ConfigError) as caught:
        await prism_gateway(
            catalog(prism_fake, line("a")), load_plugins=PLUGINS, sections={"scoring": values}
        )
    assert caught.value.key == key
    assert problem in caught.value.problem


async def test_rule_only_lines_are_checked(prism_fake, prism_gateway):
    cat = catalog(prism_fake, line("a", "g"), line("b", "g"))
    cat["providers"]["r"] = {"kind": "openai", "base_url": prism_fake.base_url("r")}
    cat["models"]["m"]["rules"] = [
        {"name": "all", "chain": [{"provider": "r", "model": "up-r", "weight": 2}]}
    ]
    with pytest.raises(ConfigError) as caught:
        await prism_gateway(cat, load_plugins=[*PLUGINS, "rules"])
    assert caught.value.key == "models.m.rules[0].chain[0].weight"
    assert "weight without a group" in caught.value.problem


async def test_a_rule_chain_group_is_ordered(prism_fake, prism_gateway):
    cat = catalog(prism_fake, line("a"))
    for name in ("r1", "r2"):
        cat["providers"][name] = {"kind": "openai", "base_url": prism_fake.base_url(name)}
    cat["models"]["m"]["rules"] = [
        {"name": "all", "chain": [line("r1", "rg"), line("r2", "rg")]},
    ]
    gw = await prism_gateway(cat, load_plugins=[*PLUGINS, "rules"], random=random.Random(4).random)
    leaders = set()
    for _ in range(12):
        answer = await chat(gw)
        assert answer.status == 200 and answer.headers["x-prism-route"] == "all"
        (note,) = answer.notes
        assert note.startswith("note scoring: group rg order ")
        leaders.add(answer.tried[0])
    assert prism_fake.hits("a") == 0
    assert leaders <= {"r1/up-r1", "r2/up-r2"}
