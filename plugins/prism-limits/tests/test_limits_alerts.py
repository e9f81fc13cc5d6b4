"""Budget alerts through the real gateway: a WARNING and a webhook event per crossing,
the budget gauge and refusals in /metrics, organisations above 80 % on the board."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prism_limits.alerts import crossed
from prism_limits.plugin import limiter_of

from prism_proxy import ConfigError, config_from_mapping, create_app
from prism_proxy.testing import eventually, installed_plugins

from .conftest import catalog

#: One word: the fake upstream counts one prompt token, so a call costs exactly 1.
SECRET = "secret-prompt-text"
PROMPT = [{"role": "user", "content": SECRET}]
#: 1 currency unit per prompt token; output is free (a call's reservation is its prompt).
ONE_PER_CALL = {"input": 1_000_000.0, "output": 0.0}
PLUGINS = ["openai", "limits", "billing", "metrics"]
ADMIN_ENV = "PRISM_LIMITS_ALERTS_TEST_ADMIN"
ADMIN_TOKEN = "alerts-admin-token"


class Webhook:
    """An alert receiver on a loopback port: keeps every event it accepted.

    ``fail_first``: the first request waits until :attr:`release` is set, then
    answers 500 (the gateway must retry it, and must not wait for it)."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.fail_first = fail_first
        self.requests = 0
        self.events: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self.release = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.authorizations.append(request.headers.get("Authorization"))
        event = await request.json()
        if self.fail_first and self.requests == 1:
            await self.release.wait()
            return web.Response(status=500)
        self.events.append(event)
        return web.Response(status=204)


@contextlib.asynccontextmanager
async def serving(hook: Webhook, path: str = "/hook") -> AsyncIterator[Webhook]:
    app = web.Application()
    app.router.add_post(path, hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    hook.url = f"http://127.0.0.1:{port}{path}"
    try:
        yield hook
    finally:
        hook.release.set()
        await runner.cleanup()


async def start(
    prism_gateway: Any,
    prism_fake: Any,
    tmp_path: Any,
    monkeypatch: Any,
    *,
    limits: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> Any:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    return await prism_gateway(
        catalog(prism_fake, price=ONE_PER_CALL),
        config={"admin_token_env": ADMIN_ENV},
        sections={
            "billing": {"ledger_path": str(tmp_path / "ledger.sqlite")},
            "limits": limits or {},
            "metrics": metrics or {},
        },
        load_plugins=PLUGINS,
    )


async def chat(gw: Any, key: str) -> Any:
    async with gw.openai(default_headers={"x-test-key": key}) as client:
        return await client.chat.completions.with_raw_response.create(
            model="m", messages=PROMPT, max_tokens=5
        )


def crossings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "prism.limits" and r.levelno == logging.WARNING and "crossed" in r.getMessage()
    ]


async def drained(*gateways: Any) -> None:
    for gw in gateways:
        limiter = limiter_of(gw.gateway.current)
        assert limiter is not None
        if limiter.fleet is not None:
            await limiter.fleet.settled()
        await limiter.alerts.outbox.drained()


async def get_json(url: str, *, admin: bool = False) -> Any:
    cookies = {"prism_board_token": ADMIN_TOKEN} if admin else {}
    async with aiohttp.ClientSession(cookies=cookies) as session:
        async with session.get(url) as response:
            assert response.status == 200
            return await response.json()


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics") as response:
            assert response.status == 200
            return await response.text()


def budget_banners(board: dict[str, Any]) -> list[str]:
    return [b["text"] for b in board["banners"] if b["kind"] == "budget"]


def test_a_crossing_is_found_exactly_at_its_boundary():
    amount = 10 * 10**9
    assert crossed(amount, 5 * 10**9, 10**9, (50, 80, 100)) == [50]
    assert crossed(amount, 5 * 10**9 - 1, 10**9, (50, 80, 100)) == []
    assert crossed(amount, 5 * 10**9 + 1, 1, (50, 80, 100)) == []  # already past before it
    assert crossed(amount, 11 * 10**9, 7 * 10**9, (50, 80, 100)) == [50, 80, 100]
    assert crossed(amount, 5 * 10**9, 0, (50,)) == []  # nothing added, nothing crossed
    assert crossed(0, 1, 1, (50,)) == []


async def test_a_soft_budget_alerts_once_per_crossing_and_keeps_serving(
    prism_gateway, prism_fake, callers, tmp_path, monkeypatch, caplog
):
    callers.org("acme", budget="10/day", budget_mode="soft")
    caplog.set_level(logging.WARNING, logger="prism.limits")
    async with serving(Webhook()) as hook:
        gw = await start(
            prism_gateway, prism_fake, tmp_path, monkeypatch, limits={"alert_url": hook.url}
        )
        seen: list[int] = []
        for number in range(1, 13):
            raw = await chat(gw, "k1@acme")
            assert raw.http_response.status_code == 200  # soft: served past 100 % too
            # Settlement (and so the WARNING) happens before the answer completes.
            seen.append(len(crossings(caplog)))
            assert number == len(seen)
        await drained(gw)
    # Calls 5, 8 and 10 crossed 50, 80 and 100 %: one line each, nothing more.
    assert seen == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3]
    lines = crossings(caplog)
    assert [line.split(" crossed ")[1][:4] for line in lines] == ["50%:", "80%:", "100%"]
    assert all("organisation acme budget 10/day" in line and "k1" in line for line in lines)
    assert "soft budget" in lines[0]
    assert SECRET not in caplog.text
    assert [(e["threshold"], e["spent"]) for e in hook.events] == [
        (50, "5"),
        (80, "8"),
        (100, "10"),
    ]
    event = hook.events[0]
    assert {k: event[k] for k in ("organisation", "key_id", "budget", "period", "mode")} == {
        "organisation": "acme",
        "key_id": "k1",
        "budget": "10",
        "period": "day",
        "mode": "soft",
    }
    assert event["scope"] == "organisation" and event["limit"] == "budget"
    assert event["currency"] and event["resets_at"] > event["period_start"]
    assert SECRET not in str(hook.events)

    # The gauge: the organisation's label only with org_label (off here), 1.2 spent.
    text = await scrape(gw.url)
    assert value(text, "prism_budget_used_ratio") == pytest.approx(1.2)
    assert 'org="' not in text
    # The board: without org_label, names for the admin only.
    public = budget_banners(await get_json(gw.url + "/prism/board.json"))
    assert public == [
        "budget: 1 organisation at or above 80% of a budget (names with org_label, or for the "
        "admin)"
    ]
    private = budget_banners(await get_json(gw.url + "/prism/board.json", admin=True))
    assert private == ["budget: acme has used 120% of a budget"]


async def test_a_failing_webhook_is_retried_and_never_delays_the_call(
    prism_gateway, prism_fake, callers, tmp_path, monkeypatch, caplog
):
    callers.org("acme", budget="2/day", budget_mode="soft")
    caplog.set_level(logging.WARNING, logger="prism.limits")
    async with serving(Webhook(fail_first=True), "/hooks/t0ken-in-path") as hook:
        # Credentials in the URL are the receiver's business, never the log's.
        url = hook.url.replace("http://", "http://alerts:pa55word@")
        gw = await start(
            prism_gateway, prism_fake, tmp_path, monkeypatch, limits={"alert_url": url}
        )
        await chat(gw, "k1@acme")  # 1 of 2: crosses 50 %
        # The call is answered while the webhook still holds the event's first POST.
        await eventually(lambda: hook.requests == 1, what="the first POST")
        assert not hook.release.is_set() and hook.events == []
        await chat(gw, "k1@acme")  # 2 of 2: crosses 80 and 100 % (queued behind it)
        hook.release.set()  # the first POST now fails with a 500: retried
        await drained(gw)
    assert [e["threshold"] for e in hook.events] == [50, 80, 100]
    assert hook.requests == 4  # the failed one, its retry, then the two others
    assert all(auth and auth.startswith("Basic ") for auth in hook.authorizations)
    outage = [r.getMessage() for r in caplog.records if "budget alert" in r.getMessage()]
    assert len(outage) == 2  # once when it failed, once when it took an event again
    assert "did not take a budget alert (HTTP 500)" in outage[0]
    assert "reach http://127.0.0.1:" in outage[1]
    assert "pa55word" not in caplog.text and "t0ken" not in caplog.text
    assert len(crossings(caplog)) == 3


async def test_refusals_and_budget_use_are_metrics_and_org_label_names_them(
    prism_gateway, prism_fake, callers, tmp_path, monkeypatch
):
    callers.org("acme", budget="10/day", budget_mode="soft")
    # Hard: each call reserves its prompt estimate (5) and really costs 1, so two fit.
    callers.org("hardco", budget="6/day")
    callers.org("quiet", rpm="0")
    gw = await start(
        prism_gateway, prism_fake, tmp_path, monkeypatch, metrics={"org_label": "true"}
    )
    for _ in range(9):
        await chat(gw, "k1@acme")
    await chat(gw, "k2@hardco")
    await chat(gw, "k2@hardco")
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "k2@hardco")
    assert refused.value.code == "budget_exceeded"
    with pytest.raises(openai.RateLimitError) as refused:
        await chat(gw, "k3@quiet")
    assert refused.value.code == "rate_limited"
    text = await scrape(gw.url)
    assert value(text, "prism_limit_refusals_total", limit="budget", scope="organisation") == 1
    assert value(text, "prism_limit_refusals_total", limit="rpm", scope="organisation") == 1
    assert value(text, "prism_budget_used_ratio", org="acme") == pytest.approx(0.9)
    assert value(text, "prism_budget_used_ratio", org="hardco") == pytest.approx(2 / 6)
    # With org_label the board names organisations to everyone, and only those above 80 %.
    board = await get_json(gw.url + "/prism/board.json")
    assert budget_banners(board) == ["budget: acme has used 90% of a budget"]


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(labels.items())
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )


def _config(**limits: object) -> Any:
    cat = {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {"m": {"chain": [{"provider": "p", "model": "up"}]}},
    }
    return config_from_mapping(
        {"disable": sorted(set(installed_plugins()) - {"openai", "limits"})},
        {"limits": limits},
        source="<test config>",
        catalog_data=cat,
    )


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"alert_url": "ftp://user:hunter2@example.com/x"}, r"alert_url: expected an http"),
        ({"alert_url": "https://"}, r"alert_url: expected an http"),
        ({"alert_url": "http://example.com:99999/"}, r"alert_url: expected an http"),
        ({"alert_thresholds": "50, lots"}, r"alert_thresholds: expected whole percentages"),
        ({"alert_thresholds": "0"}, r"alert_thresholds: expected percentages from 1"),
    ],
)
def test_alert_settings_mistakes_stop_start_up_without_echoing_the_url(limits, message):
    with pytest.raises(ConfigError, match=message) as err:
        create_app(_config(**limits))
    assert "hunter2" not in str(err.value)


def test_alert_thresholds_are_read_as_percentages():
    from prism_limits.settings import LimitsSettings

    assert LimitsSettings.from_config(_config()).alert_thresholds == (50, 80, 100)
    read = LimitsSettings.from_config(_config(alert_thresholds="90%, 75 ,90"))
    assert read.alert_thresholds == (75, 90)
    assert LimitsSettings.from_config(_config(alert_thresholds=[25, 100])).alert_thresholds == (
        25,
        100,
    )


async def test_across_a_fleet_each_crossing_is_one_event_from_one_gateway(
    prism_gateway, prism_fake, prism_redis, callers, tmp_path, caplog
):
    callers.org("acme", budget="10/day", budget_mode="soft")
    caplog.set_level(logging.WARNING, logger="prism.limits")
    async with serving(Webhook()) as hook:
        gateways = []
        for number in range(3):
            gateways.append(
                await prism_gateway(
                    catalog(prism_fake, price=ONE_PER_CALL),
                    sections={
                        "billing": {"ledger_path": str(tmp_path / f"ledger{number}.sqlite")},
                        "limits": {"alert_url": hook.url},
                        # Generous: a loaded test machine must not look like a Redis outage.
                        "redis": {
                            "url": prism_redis.url,
                            "key_prefix": prism_redis.prefix,
                            "timeout_ms": 5000,
                        },
                    },
                    load_plugins=["openai", "limits", "billing", "redis"],
                )
            )
        # Twelve calls at once, four on each gateway: their costs reach Redis in any order.
        answers = await asyncio.gather(
            *(chat(gateways[n % 3], f"k{n % 3}@acme") for n in range(12))
        )
        assert all(raw.http_response.status_code == 200 for raw in answers)
        await drained(*gateways)
    # Each crossing was seen by exactly one settlement on one gateway.
    assert sorted((e["threshold"], e["spent"]) for e in hook.events) == [
        (50, "5"),
        (80, "8"),
        (100, "10"),
    ]
    assert len(crossings(caplog)) == 3
    assert {e["organisation"] for e in hook.events} == {"acme"}
