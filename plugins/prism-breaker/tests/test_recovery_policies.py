"""After recovery: the slow start (ramp_s), manual restore, and reviews flagged before due."""

from __future__ import annotations

import logging

import pytest
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, config_from_mapping, create_app


class Dice:
    """The gateway's injected random(): returns whatever the test sets."""

    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value


async def restore_flaky(kit, gw, fake_time) -> None:
    """Trip flaky (three 500s), wait out the window, pass the one-call trial."""
    await kit.chat(gw)
    fake_time.advance(31)
    answer = await kit.chat(gw)
    assert answer.headers.get("x-prism-breaker") == "trial flaky/up-flaky"
    assert (await kit.binding(gw, "flaky/up-flaky"))["state"] == "eligible"


BREAKER = {"trial_min_successes": 1, "trial_min_duration_s": 0}


async def test_a_restored_binding_takes_a_growing_share_of_calls(
    prism_fake, prism_gateway, kit, fake_time
):
    dice = Dice()
    prism_fake.script("flaky", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        kit.catalog("flaky", "ok"),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        random=dice,
        sections={"breaker": {**BREAKER, "ramp_s": 40}},
    )
    await restore_flaky(kit, gw, fake_time)

    def served(answer) -> str | None:
        return answer.provider

    # Just restored: 10% of calls (the floor).
    dice.value = 0.09
    assert served(await kit.chat(gw)) == "flaky"
    dice.value = 0.11
    answer = await kit.chat(gw)
    assert served(answer) == "ok"
    assert "flaky/up-flaky skipped breaker: ramping up (10% of calls)" in answer.log
    ramp = (await kit.binding(gw, "flaky/up-flaky"))["ramp"]
    assert ramp == {"share": 0.1, "left_s": 40.0}
    # Half way: half the calls.
    fake_time.advance(20)
    dice.value = 0.49
    assert served(await kit.chat(gw)) == "flaky"
    dice.value = 0.51
    assert served(await kit.chat(gw)) == "ok"
    # Ramp over: every call, and the health record says nothing of a ramp.
    fake_time.advance(20)
    dice.value = 0.99
    assert served(await kit.chat(gw)) == "flaky"
    assert "ramp" not in await kit.binding(gw, "flaky/up-flaky")


async def test_a_manual_line_waits_for_release_after_its_trial_passes(
    prism_fake, prism_gateway, kit, fake_time, admin_env, caplog
):
    catalog = kit.catalog("flaky", "ok")
    catalog["models"]["m"]["chain"][0]["restore"] = "manual"
    prism_fake.script("flaky", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        catalog,
        config=admin_env,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        sections={"breaker": {**BREAKER, "ramp_s": 0}},
    )
    await restore_flaky(kit, gw, fake_time)
    held = await kit.chat(gw)
    assert held.provider == "ok"
    health = await kit.health(gw, token="breaker-admin-token")
    (hold,) = health["overrides"]
    assert (hold["kind"], hold["target"], hold["owner"]) == (
        "quarantine",
        "flaky/up-flaky",
        "breaker",
    )
    assert f"flaky/up-flaky skipped breaker: quarantined ({hold['id']})" in held.log
    assert any("restore = manual" in r.message and hold["id"] in r.message for r in caplog.records)

    status, _ = await kit.admin(
        gw,
        "POST",
        f"/prism/breaker/overrides/{hold['id']}/release",
        {"owner": "ana", "reason": "checked"},
    )
    assert status == 200
    assert (await kit.chat(gw)).provider == "flaky"


def test_restore_takes_auto_or_manual():
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x", "restore": "later"}]}},
    }
    with pytest.raises(ConfigError) as info:
        create_app(config_from_mapping({}, catalog_data=catalog))
    assert info.value.key == "models.m.chain[0].restore"


@pytest.mark.parametrize(("warn_h", "flagged"), [(24, True), (5, False)])
async def test_an_override_is_flagged_before_its_review_is_due(
    prism_fake, prism_gateway, kit, admin_env, caplog, warn_h, flagged
):
    gw = await prism_gateway(
        kit.catalog("flaky", "ok"),
        config=admin_env,
        sections={"breaker": {"review_warn_h": warn_h, "refresh_s": 0.05}},
    )
    caplog.set_level(logging.WARNING, "prism.breaker")
    status, body = await kit.admin(
        gw,
        "POST",
        "/prism/breaker/overrides",
        {"kind": "quarantine", "scope": "binding", "target": "flaky/up-flaky",
         "reason": "vendor incident", "owner": "ana", "review_by": "10h"},
    )  # fmt: skip
    assert status == 201
    override_id = body["override"]["id"]

    async def said() -> bool:
        return any("due for review" in r.message for r in caplog.records)

    health = await kit.health(gw)
    assert (override_id in health["reviews_due_soon"]) is flagged
    assert health["overdue_reviews"] == []
    if flagged:
        await kit.eventually(said)
        assert sum("due for review" in r.message for r in caplog.records) == 1
