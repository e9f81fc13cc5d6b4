"""The bundled plugins behave the same whatever order they are registered in.

Pluggy calls a hook's implementations latest-registered first, and the order
of registration is the order plugins happen to be installed in.  So every
bundled plugin is registered here in many orders, the same calls are made
(a failover, a refusal two plugins would both make, a bill, a scrape) and
everything a caller or an operator sees must come out the same.  And
``tryfirst``/``trylast`` appear only where a hook's contract asks for an order.
"""

from __future__ import annotations

import importlib.metadata
import random
import re
from pathlib import Path
from typing import Any

import aiohttp

from prism_proxy.cli import main
from prism_proxy.testing import installed_plugins

#: The bundled plugins this scenario turns on (every one whose behaviour a call shows).
PLUGINS = (
    "openai",
    "anthropic",
    "keys",
    "billing",
    "breaker",
    "scoring",
    "regions",
    "rules",
    "redis",
    "metrics",
    "timeout-header",
    "probes",
    "otel",
)

#: Where a hook's documented contract asks for an order (docs/plugin-guide.md, "Order").
CONTRACT_ORDER = {
    ("prism_authenticate", "prism.default-auth", "trylast"),
    ("prism_select_route", "prism.default-route", "trylast"),
    ("prism_classify", "prism.default-classify", "trylast"),
    ("prism_classify", "anthropic.errors", "tryfirst"),
    ("prism_call_start", "keys.auth", "tryfirst"),
    ("prism_select_route", "regions.policy", "tryfirst"),
    ("prism_admit_attempt", "breaker.runtime", "trylast"),
}

VOLATILE = {"x-request-id", "x-prism-request-id"}


def modules() -> dict[str, Any]:
    found = {}
    for entry_point in importlib.metadata.entry_points(group="prism_proxy"):
        if entry_point.name in PLUGINS:
            found[entry_point.name] = entry_point.load()
    assert set(found) == set(PLUGINS), "a bundled plugin is not installed"
    return found


def catalog(fake: Any) -> dict[str, Any]:
    price = {"input": 1.0, "output": 2.0}
    return {
        "providers": {
            "alpha": {"kind": "openai", "base_url": fake.base_url("ok"), "region": "eu-west-1"},
            "beta": {"kind": "openai", "base_url": fake.base_url("err500"), "region": "eu-west-1"},
            "gamma": {"kind": "openai", "base_url": fake.base_url("ok"), "region": "us-east-1"},
        },
        "models": {
            "chat-a": {
                "chain": [
                    {"provider": "beta", "model": "up-beta", "price": price},
                    {"provider": "alpha", "model": "up-alpha", "price": price},
                    {"provider": "gamma", "model": "up-gamma", "price": price},
                ],
            },
            "chat-b": {"chain": [{"provider": "alpha", "model": "up-alpha", "price": price}]},
        },
    }


def make_keys(directory: Path, capsys: Any) -> tuple[Path, str, str]:
    """Two keys in a fresh key database: one for every model, one for chat-b only."""
    db = directory / "keys.sqlite"
    ini = directory / "keys.ini"
    ini.write_text(f"[prism]\ncatalog = c.toml\n[prism:keys]\ndb_path = {db}\n")
    (directory / "c.toml").write_text("")
    made = []
    for scopes in ("*", "chat, model:chat-b"):
        capsys.readouterr()
        assert (
            main(["keys", "create", "--config", str(ini), "--org", "acme", "--scopes", scopes]) == 0
        )
        made.append(capsys.readouterr().out.splitlines()[-1])
    return db, made[0], made[1]


async def scenario(gw: Any, every: str, narrow: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:

        async def post(key: str, model: str, **headers: str) -> tuple[int, dict[str, str], Any]:
            async with session.post(
                gw.url + "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {key}", **headers},
            ) as response:
                body = await response.json()
                shown = {
                    name.lower(): re.sub(r" \d+ms", " _ms", value)  # timings vary
                    for name, value in response.headers.items()
                    if name.lower().startswith("x-") and name.lower() not in VOLATILE
                }
                return response.status, shown, body

        for index in range(3):
            status, headers, body = await post(every, "chat-a")
            seen[f"call {index}"] = (status, headers, body["choices"][0]["message"]["content"])
        # Refused by two plugins at once: the key's scope (keys) and the region header
        # (regions). The contract says who speaks: keys, tryfirst.
        status, headers, body = await post(narrow, "chat-a", **{"x-prism-regions": "mars!"})
        seen["refused"] = (status, body["error"]["code"])
        status, headers, body = await post(every, "chat-a", **{"x-prism-regions": "us-east-1"})
        seen["regional"] = (status, headers)
        async with session.get(gw.url + "/metrics") as response:
            text = await response.text()
        seen["metrics"] = sorted(
            line
            for line in text.splitlines()
            if line.startswith(("prism_requests_total", "prism_attempts_total", "prism_cost_total"))
        )
    return seen


async def test_every_order_behaves_the_same(
    prism_gateway, prism_fake, prism_redis, tmp_path, capsys
):
    found = modules()
    db, every, narrow = make_keys(tmp_path, capsys)
    names = list(PLUGINS)
    orders = [names, names[::-1]]
    shuffler = random.Random(20261202)
    for _ in range(4):
        order = names[:]
        shuffler.shuffle(order)
        orders.append(order)
    results = []
    for number, order in enumerate(orders):
        gw = await prism_gateway(
            catalog(prism_fake),
            config={"retries": 0},
            sections={
                "keys": {"db_path": str(db)},
                "billing": {"ledger_path": str(tmp_path / f"ledger-{number}.sqlite")},
                "regions": {"default": "eu-west-1, us-east-1"},
                "redis": {"url": prism_redis.url, "key_prefix": f"{prism_redis.prefix}:{number}"},
            },
            plugins=[(found[name], name) for name in order],
            load_plugins=PLUGINS,
            random=lambda: 0.5,
        )
        results.append(await scenario(gw, every, narrow))
        await gw.stop()
    first = results[0]
    assert first["call 0"][0] == 200 and first["refused"] == (403, "insufficient_scope")
    assert first["metrics"], "the scrape shows the calls"
    for order, result in zip(orders[1:], results[1:], strict=True):
        differ = {key: (first[key], result[key]) for key in first if result.get(key) != first[key]}
        assert not differ, f"registered as {order}: {differ}"


def test_tryfirst_and_trylast_only_where_a_contract_asks():
    from prism_proxy import config_from_mapping
    from prism_proxy.generation import build_generation

    config = config_from_mapping(
        {"disable": sorted(set(installed_plugins()) - set(PLUGINS))},
        {"keys": {"db_path": ":memory:"}, "billing": {"ledger_path": ":memory:"}},
        catalog_data={"providers": {}, "models": {}},
    )
    generation = build_generation(config)
    marked = set()
    for name in dir(generation.pm.hook):
        if not name.startswith("prism_"):
            continue
        for impl in getattr(generation.pm.hook, name).get_hookimpls():
            for mark in ("tryfirst", "trylast"):
                if getattr(impl, mark):
                    marked.add((name, impl.plugin_name, mark))
    assert marked <= CONTRACT_ORDER, f"marked without a contract: {marked - CONTRACT_ORDER}"
    assert ("prism_call_start", "keys.auth", "tryfirst") in marked, "the scan sees the plugins"
