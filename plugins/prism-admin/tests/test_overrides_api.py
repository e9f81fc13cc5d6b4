"""Breaker overrides through the admin API: the operator only, the breaker obeys them, each write
is in the admin audit log; bad input names the field and quarantines nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .conftest import ADMIN_TOKEN, ENV, PRICE, Api, start

CHAT = ["chat", "model:*"]


def two_lines(fake: Any) -> dict[str, Any]:
    return {
        "providers": {
            "alpha": {"kind": "openai", "base_url": fake.base_url("a")},
            "beta": {"kind": "openai", "base_url": fake.base_url("b")},
        },
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": "alpha", "model": "up", "price": PRICE},
                    {"provider": "beta", "model": "up", "price": PRICE},
                ],
            }
        },
    }


@pytest.fixture
async def bapi(
    prism_gateway: Any,
    prism_fake: Any,
    prism_clock: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    monkeypatch.setenv(ENV, ADMIN_TOKEN)
    gateway = await start(
        prism_gateway,
        prism_fake,
        prism_clock,
        tmp_path,
        {"db_path": "keys.db", "refresh_s": 0.05},
        catalog_data=two_lines(prism_fake),
        plugins=("breaker",),
    )
    async with aiohttp.ClientSession() as session:
        yield Api(gateway.url, session, gateway)


async def served_by(api: Api, fake: Any, key: str) -> str:
    before = {name: fake.hits(name) for name in ("a", "b")}
    client = api.gateway.openai(api_key=key)
    try:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        await client.close()
    return next(name for name in ("a", "b") if fake.hits(name) > before[name])


QUARANTINE = {"kind": "quarantine", "scope": "binding", "target": "alpha/up", "reason": "leak"}


async def test_only_the_operator_may_touch_overrides(bapi):
    await bapi.ok("POST", "/orgs", json={"name": "acme"})
    boss = await bapi.ok("POST", "/keys", json={"org": "acme", "scopes": ["admin", *CHAT]})
    plain = await bapi.ok("POST", "/keys", json={"org": "acme", "scopes": CHAT})
    made = await bapi.ok("POST", "/overrides", json=QUARANTINE)
    calls = [
        ("GET", "/overrides", None),
        ("POST", "/overrides", QUARANTINE),
        ("POST", f"/overrides/{made['id']}/release", {"reason": "r"}),
    ]
    for method, path, body in calls:
        for token in (boss["key"], plain["key"]):
            status, answer = await bapi.call(method, path, token, json=body)
            assert status == 403, (path, answer)
            assert answer["error"]["code"] == "forbidden"
        status, answer = await bapi.call(method, path, None, json=body)
        assert status == 401 and answer["error"]["code"] == "unauthenticated"
    status, answer = await bapi.call("GET", "/overrides", boss["key"])
    assert "breaker overrides" in answer["error"]["message"]
    # Nothing an org admin tried changed anything.
    listed = await bapi.ok("GET", "/overrides")
    assert [o["id"] for o in listed["overrides"]] == [made["id"]]


async def test_a_quarantine_moves_traffic_until_released_and_is_audited(bapi, prism_fake):
    await bapi.ok("POST", "/orgs", json={"name": "acme"})
    key = (await bapi.ok("POST", "/keys", json={"org": "acme", "scopes": CHAT}))["key"]
    assert await served_by(bapi, prism_fake, key) == "a"

    made = await bapi.ok("POST", "/overrides", json={**QUARANTINE, "review_by": "36h"})
    assert (made["kind"], made["target"], made["owner"]) == ("quarantine", "alpha/up", "admin")
    assert made["reason"] == "leak" and made["review_by"].endswith("Z")
    assert await served_by(bapi, prism_fake, key) == "b"
    listed = await bapi.ok("GET", "/overrides")
    assert [o["id"] for o in listed["overrides"]] == [made["id"]]
    # The breaker's own view agrees: it is one override, not a copy.
    async with bapi.session.get(bapi.url + "/prism/health") as response:
        health = await response.json()
    assert [o["id"] for o in health["overrides"]] == [made["id"]]

    released = await bapi.ok(
        "POST", f"/overrides/{made['id']}/release", json={"owner": "ana", "reason": "fixed"}
    )
    assert released["id"] == made["id"]
    assert (await bapi.ok("GET", "/overrides"))["overrides"] == []
    assert await served_by(bapi, prism_fake, key) == "a"

    entries = (await bapi.ok("GET", "/audit"))["entries"]
    assert [(e["action"], e["subject"], e["actor"]) for e in entries[:2]] == [
        ("override.release", f"override:{made['id']}", "admin"),
        ("override.quarantine", f"override:{made['id']}", "admin"),
    ]
    assert entries[1]["after"]["reason"] == "leak" and entries[1]["before"] is None
    assert entries[0]["before"]["id"] == made["id"] and entries[0]["after"] is None
    # An organisation's administrator does not see the operator's overrides in its log.
    boss = await bapi.ok("POST", "/keys", json={"org": "acme", "scopes": ["admin"]})
    own = (await bapi.ok("GET", "/audit", boss["key"]))["entries"]
    assert not [e for e in own if e["action"].startswith("override.")]


async def test_a_cap_and_bad_input(bapi, prism_fake):
    cap = await bapi.ok(
        "POST",
        "/overrides",
        json={
            "kind": "cap",
            "scope": "provider",
            "target": "beta",
            "reason": "slow",
            "owner": "ana",
            "max_in_flight": 2,
            "expires": "2h",
        },
    )
    assert (cap["kind"], cap["max_in_flight"], cap["owner"], cap["expired"]) == (
        "cap",
        2,
        "ana",
        False,
    )
    refusals = [
        ({**QUARANTINE, "colour": "red"}, "colour"),
        ({**QUARANTINE, "target": "nowhere/none"}, "target"),
        ({**QUARANTINE, "kind": "ban"}, "kind"),
        ({**QUARANTINE, "kind": "cap"}, "max_in_flight"),
        ({**QUARANTINE, "review_by": "yesterday"}, "review_by"),
        ({k: v for k, v in QUARANTINE.items() if k != "reason"}, "reason"),
        ({**QUARANTINE, "max_in_flight": "two", "kind": "cap"}, "max_in_flight"),
    ]
    for body, field in refusals:
        status, answer = await bapi.call("POST", "/overrides", json=body)
        assert status == 400, (body, answer)
        assert (answer["error"]["code"], answer["error"]["param"]) == ("invalid_request", field)
    assert [o["id"] for o in (await bapi.ok("GET", "/overrides"))["overrides"]] == [cap["id"]]
    status, answer = await bapi.call("POST", "/overrides/ovr_nothing/release", json={})
    assert status == 404 and answer["error"]["code"] == "override_not_found"
    status, answer = await bapi.call("POST", f"/overrides/{cap['id']}/release", json={"x": 1})
    assert status == 400 and answer["error"]["param"] == "x"


async def test_without_the_breaker_overrides_answer_404(api):
    status, answer = await api.call("GET", "/overrides")
    assert status == 404 and answer["error"]["code"] == "breaker_off"
