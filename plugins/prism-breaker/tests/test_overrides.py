"""Operator overrides through the admin API and the CLI; they outrank automation."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from prism_breaker import AuditEntry, Override, SqliteStore
from prism_fake_upstream import Fault

from prism_proxy.cli import main as prism_main

OVERRIDES = "/prism/breaker/overrides"


def quarantine(target: str, **extra: object) -> dict:
    return {
        "kind": "quarantine",
        "scope": "binding",
        "target": target,
        "reason": "suspected data-handling problem",
        "owner": "alice",
        **extra,
    }


async def test_a_quarantine_survives_successful_trials(
    prism_fake, prism_gateway, kit, fake_time, admin_env
):
    # b trips, then answers again -- slowly, so the operator acts mid-trial.
    prism_fake.script("b", [Fault(status=500)] * 3 + [Fault(stall_s=0.4)])
    gw = await prism_gateway(
        kit.catalog("b", "a"),
        config=admin_env,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        sections={"breaker": {"trial_min_successes": 1, "trial_min_duration_s": 0}},
    )
    await kit.chat(gw)
    fake_time.advance(31)
    trial = asyncio.create_task(kit.chat(gw))
    await kit.eventually(lambda: _hits(prism_fake, "b", 4))
    status, created = await kit.admin(gw, "POST", OVERRIDES, quarantine("b/up-b"))
    assert status == 201
    override_id = created["override"]["id"]
    assert (await trial).provider == "b"  # the trial that was in flight succeeded...
    entry = await kit.binding(gw, "b/up-b")
    assert entry["state"] == "eligible"  # ...and automation restored the binding...
    assert entry["assessment"] == "unavailable"  # ...but the quarantine holds.
    for _ in range(3):
        fake_time.advance(3600)
        answer = await kit.chat(gw)
        assert answer.provider == "a"
        assert answer.log[0] == f"b/up-b skipped breaker: quarantined ({override_id})"
    assert prism_fake.hits("b") == 4
    status, released = await kit.admin(
        gw, "POST", f"{OVERRIDES}/{override_id}/release", {"owner": "bob", "reason": "fixed"}
    )
    assert status == 200 and released["released"]["id"] == override_id
    assert (await kit.chat(gw)).provider == "b"
    status, audit = await kit.admin(gw, "GET", "/prism/breaker/audit?binding=b/up-b")
    actions = [(e["action"], e["actor"], e["to"]) for e in reversed(audit["entries"])]
    assert actions == [
        ("transition", "breaker", "suspect"),
        ("transition", "breaker", "isolated"),
        ("transition", "breaker", "trial"),
        ("quarantine", "alice", None),
        ("transition", "breaker", "eligible"),
        ("release", "bob", None),
    ]
    quarantined = audit["entries"][-4]
    assert quarantined["evidence"]["bindings"]["b/up-b"]["state"] == "trial"
    assert quarantined["cause"] == "suspected data-handling problem"


async def test_quarantine_is_not_lifted_by_a_stand_down(prism_fake, prism_gateway, kit, admin_env):
    prism_fake.script("b", [Fault(status=500)] * 3)
    gw = await prism_gateway(kit.catalog("a", "b"), config=admin_env)
    await kit.admin(gw, "POST", OVERRIDES, quarantine("a/up-a"))
    await kit.chat(gw)  # a skipped, b trips
    answer = await kit.chat(gw)  # nothing is open: stand down, but only for b
    assert answer.headers["x-prism-breaker"] == "stand-down"
    assert answer.log[0].startswith("a/up-a skipped breaker: quarantined")
    assert answer.provider == "b"
    assert prism_fake.hits("a") == 0


async def test_everything_quarantined_is_a_503_naming_the_override(
    prism_fake, prism_gateway, kit, admin_env
):
    gw = await prism_gateway(kit.catalog("a"), config=admin_env)
    await kit.admin(
        gw, "POST", OVERRIDES, {**quarantine("a"), "scope": "provider", "review_by": "2h"}
    )
    answer = await kit.chat(gw)
    assert answer.status == 503
    assert answer.body["error"]["code"] == "no_binding_available"
    assert answer.body["error"]["attempts"][0]["reason"].startswith("breaker: quarantined")
    assert prism_fake.hits("a") == 0


async def test_a_cap_limits_in_flight_and_expires(
    prism_fake, prism_gateway, kit, fake_time, admin_env
):
    prism_fake.script("a", [Fault(stall_s=0.4)])
    gw = await prism_gateway(
        kit.catalog("a", "b"),
        config=admin_env,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        sections={"breaker": {"refresh_s": 0.05}},
    )
    cap = {
        "kind": "cap",
        "scope": "model",
        "target": "up-a",
        "max_in_flight": 1,
        "expires": "1h",
        "reason": "provider asked us to slow down",
        "owner": "carol",
    }
    status, created = await kit.admin(gw, "POST", OVERRIDES, cap)
    assert status == 201 and created["override"]["max_in_flight"] == 1
    first = asyncio.create_task(kit.chat(gw))
    await kit.eventually(lambda: _hits(prism_fake, "a", 1))
    second = await kit.chat(gw)  # a is at its cap while the first call is in flight
    assert second.provider == "b"
    assert second.log[0].startswith("a/up-a skipped breaker: cap 1 reached")
    assert (await first).provider == "a"
    assert (await kit.chat(gw)).provider == "a"  # room again
    fake_time.advance(3601)

    async def expired() -> bool:
        _, body = await kit.admin(gw, "GET", "/prism/breaker/audit")
        return bool(body["entries"] and body["entries"][0]["action"] == "expire")

    await kit.eventually(expired)
    status, listing = await kit.admin(gw, "GET", OVERRIDES)
    assert listing["overrides"] == []


async def test_a_full_cap_vetoes_a_retry_and_a_later_binding(
    prism_fake, prism_gateway, kit, admin_env
):
    # The call's route (a, b, c) is chosen while a and b are free.  a fails once;
    # while the call backs off before retrying it, other callers fill a's and b's
    # caps.  Both are then vetoed at the moment of the attempt, not just at routing.
    prism_fake.script("a", [Fault(status=500), Fault(stall_s=1.5)])
    prism_fake.script("b", [Fault(stall_s=1.5)])
    backing_off, go_on = asyncio.Event(), asyncio.Event()

    async def gated_sleep(seconds: float) -> None:  # the gateway's retry pause
        backing_off.set()
        await go_on.wait()

    def chain(*names: str) -> dict:
        return {"chain": [{"provider": n, "model": f"up-{n}"} for n in names]}

    catalog = {
        "providers": {n: {"kind": "openai", "base_url": prism_fake.base_url(n)} for n in "abc"},
        "models": {"m": chain("a", "b", "c"), "only-a": chain("a"), "only-b": chain("b")},
    }
    gw = await prism_gateway(catalog, config=admin_env, sleep=gated_sleep)
    caps = []
    for target in ("a/up-a", "b/up-b"):
        cap = {
            "kind": "cap",
            "scope": "binding",
            "target": target,
            "max_in_flight": 1,
            "reason": "provider asked us to slow down",
            "owner": "carol",
        }
        status, created = await kit.admin(gw, "POST", OVERRIDES, cap)
        assert status == 201
        caps.append(created["override"]["id"])
    call = asyncio.create_task(kit.chat(gw))
    async with asyncio.timeout(5):
        await backing_off.wait()
    others = [asyncio.create_task(kit.chat(gw, model=name)) for name in ("only-a", "only-b")]

    async def both_in_flight() -> bool:
        return prism_fake.hits("a") == 2 and prism_fake.hits("b") == 1

    await kit.eventually(both_in_flight)
    go_on.set()
    answer = await call
    assert answer.status == 200 and answer.provider == "c"
    assert answer.steps == [
        "a/up-a transient 500",
        f"a/up-a vetoed breaker: cap 1 reached ({caps[0]})",  # the retry
        f"b/up-b vetoed breaker: cap 1 reached ({caps[1]})",  # the later binding
        "c/up-c ok 200",
    ]
    assert [o.provider for o in await asyncio.gather(*others)] == ["a", "b"]
    assert (prism_fake.hits("a"), prism_fake.hits("b"), prism_fake.hits("c")) == (2, 1, 1)


async def test_overrides_past_review_are_reported(
    prism_fake, prism_gateway, kit, fake_time, admin_env
):
    gw = await prism_gateway(
        kit.catalog("a"), config=admin_env, clock=fake_time.clock, sleep=fake_time.sleep
    )
    _, created = await kit.admin(gw, "POST", OVERRIDES, quarantine("a/up-a", review_by="1d"))
    override_id = created["override"]["id"]
    assert (await kit.health(gw))["overdue_reviews"] == []
    fake_time.advance(86_401)
    health = await kit.health(gw)
    assert health["overdue_reviews"] == [override_id]
    assert health["bindings"][0]["overrides"][0]["review_overdue"] is True
    _, listing = await kit.admin(gw, "GET", OVERRIDES)
    assert listing["overdue_reviews"] == [override_id]


async def test_health_is_open_but_operator_text_needs_the_token(
    prism_fake, prism_gateway, kit, admin_env
):
    gw = await prism_gateway(kit.catalog("a"), config=admin_env)
    await kit.admin(gw, "POST", OVERRIDES, quarantine("a/up-a"))
    public = (await kit.health(gw))["overrides"][0]
    assert "reason" not in public and "owner" not in public
    assert public["kind"] == "quarantine" and public["target"] == "a/up-a"
    admin = (await kit.health(gw, token="breaker-admin-token"))["overrides"][0]
    assert (admin["reason"], admin["owner"]) == ("suspected data-handling problem", "alice")


async def test_the_admin_api_needs_the_token(prism_fake, prism_gateway, kit, admin_env):
    closed = await prism_gateway(kit.catalog("a"))
    status, body = await kit.admin(closed, "POST", OVERRIDES, quarantine("a/up-a"))
    assert (status, body["error"]["code"]) == (403, "admin_disabled")
    gw = await prism_gateway(kit.catalog("a"), config=admin_env)
    for token in (None, "wrong"):
        status, body = await kit.admin(gw, "GET", OVERRIDES, token=token)
        assert (status, body["error"]["code"]) == (401, "invalid_admin_token")


@pytest.mark.parametrize(
    ("change", "param", "fragment"),
    [
        ({"reason": ""}, "reason", "required"),
        ({"owner": None}, "owner", "required"),
        ({"kind": "block"}, "kind", "expected one of quarantine, cap"),
        ({"scope": "region"}, "scope", "expected one of binding, provider, model"),
        ({"target": "a/typo"}, "target", "no binding 'a/typo' in the catalog"),
        ({"review_by": "yesterday"}, "review_by", "expected a duration like 36h"),
        ({"review_by": "2001-01-01T00:00:00Z"}, "review_by", "must be in the future"),
        ({"expires": "1h"}, "expires", "a quarantine never expires on its own"),
        ({"kind": "cap"}, "max_in_flight", "a cap needs max_in_flight"),
        ({"kind": "cap", "max_in_flight": "2"}, "max_in_flight", "expected a whole number"),
    ],
)
async def test_bad_override_input_is_a_400_naming_the_field(
    prism_fake, prism_gateway, kit, admin_env, change, param, fragment
):
    gw = await prism_gateway(kit.catalog("a"), config=admin_env)
    body = {k: v for k, v in {**quarantine("a/up-a"), **change}.items() if v is not None}
    status, answer = await kit.admin(gw, "POST", OVERRIDES, body)
    assert status == 400
    assert answer["error"]["code"] == "invalid_override"
    assert answer["error"]["param"] == param
    assert fragment in answer["error"]["message"]


async def test_releasing_an_unknown_override_is_a_404(prism_fake, prism_gateway, kit, admin_env):
    gw = await prism_gateway(kit.catalog("a"), config=admin_env)
    status, body = await kit.admin(gw, "POST", f"{OVERRIDES}/ovr_nope/release", {"owner": "bob"})
    assert (status, body["error"]["code"]) == (404, "override_not_found")


async def test_cli_overrides_reach_a_running_gateway(
    prism_fake, prism_gateway, kit, tmp_path, capsys
):
    state = tmp_path / "breaker.sqlite"
    (tmp_path / "catalog.toml").write_text(
        f'[providers.a]\nkind = "openai"\nbase_url = "{prism_fake.base_url("a")}"\n'
        f'[providers.b]\nkind = "openai"\nbase_url = "{prism_fake.base_url("b")}"\n'
        '[models.m]\nchain = [{ provider = "a", model = "up-a" }, '
        '{ provider = "b", model = "up-b" }]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        "[prism]\ncatalog = catalog.toml\n[prism:breaker]\nstate_path = breaker.sqlite\n"
    )
    gw = await prism_gateway(
        kit.catalog("a", "b"),
        sections={"breaker": {"state_path": str(state), "refresh_s": 0.05}},
    )
    assert (await kit.chat(gw)).provider == "a"

    code = await asyncio.to_thread(
        prism_main,
        ["breaker", "quarantine", "--binding", "a/up-a", "--reason", "key leaked",
         "--owner", "dana", "--config", str(ini)],
    )  # fmt: skip
    assert code == 0
    override_id = capsys.readouterr().out.split()[0]
    assert override_id.startswith("ovr_")

    async def applied() -> bool:
        return (await kit.chat(gw)).provider == "b"

    await kit.eventually(applied)

    code = await asyncio.to_thread(prism_main, ["breaker", "list", "--json", "--config", str(ini)])
    listing = orjson.loads(capsys.readouterr().out)
    assert code == 0
    assert listing["overrides"][0]["id"] == override_id
    assert listing["overrides"][0]["owner"] == "dana"
    assert {b["binding"]: b["overrides"] for b in listing["bindings"]} == {
        "a/up-a": [override_id],
        "b/up-b": [],
    }

    code = await asyncio.to_thread(
        prism_main, ["breaker", "release", override_id, "--owner", "erin", "--config", str(ini)]
    )
    assert code == 0

    async def lifted() -> bool:
        return (await kit.chat(gw)).provider == "a"

    await kit.eventually(lifted)
    capsys.readouterr()
    code = await asyncio.to_thread(
        prism_main, ["breaker", "audit", "--binding", "a/up-a", "--config", str(ini)]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert f"a/up-a  release {override_id}  by erin: released" in out[0]
    assert f"a/up-a  quarantine {override_id}  by dana: key leaked" in out[1]


async def test_cli_reports_overdue_reviews_and_refuses_typos(tmp_path, capsys, prism_fake):
    (tmp_path / "catalog.toml").write_text(
        f'[providers.a]\nkind = "openai"\nbase_url = "{prism_fake.base_url("a")}"\n'
        '[models.m]\nchain = [{ provider = "a", model = "up-a" }]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text("[prism]\ncatalog = catalog.toml\n")  # state file: the default, beside it
    now = time.time()
    stale = Override(
        id="ovr_stale",
        kind="cap",
        scope="provider",
        target="a",
        reason="slow down",
        owner="frank",
        created_at=now - 10 * 86400,
        review_by=now - 3 * 86400,
        max_in_flight=4,
    )
    store = SqliteStore(str(tmp_path / "prism-breaker.sqlite"))
    await store.open()
    await store.add_override(stale, AuditEntry(now, "frank", "cap", "provider:a", "slow down"))
    await store.close()

    assert await asyncio.to_thread(prism_main, ["breaker", "list", "--config", str(ini)]) == 0
    out = capsys.readouterr().out
    assert "ovr_stale  cap max_in_flight=4 provider:a  owner frank" in out
    assert "REVIEW OVERDUE" in out

    code = await asyncio.to_thread(
        prism_main,
        ["breaker", "quarantine", "--provider", "aa", "--reason", "x", "--config", str(ini)],
    )
    assert code == 1
    assert "--provider: no provider 'aa' in the catalog (known: a)" in capsys.readouterr().err


def _hits(fake, name: str, count: int):
    async def check() -> bool:
        return bool(fake.hits(name) >= count)

    return check()
