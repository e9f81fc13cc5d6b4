"""Telemetry.set: gauges other plugins set, by organisation only where org_label allows it."""

from __future__ import annotations

from typing import Any

import aiohttp

from prism_proxy import TELEMETRY, Call, Generation, hookimpl

from .conftest import chat, scrape, value


class Levels:
    """A stand-in plugin: ``x-test-level: ORG=VALUE`` sets that organisation's budget use."""

    def __init__(self) -> None:
        self.generation: Generation | None = None

    @hookimpl
    def prism_generation(self, generation: Generation) -> None:
        self.generation = generation

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        level = call.request.headers.get("x-test-level")
        if level and self.generation is not None:
            org, _, used = level.partition("=")
            telemetry = self.generation.services.get(TELEMETRY)
            telemetry.set("prism_budget_used_ratio", float(used), org=org)
            # Not a gauge: refused, said once.
            telemetry.set("prism_limit_refusals_total", 1.0, limit="rpm", scope="key")


def catalog(fake: Any) -> dict[str, Any]:
    return {
        "providers": {"ok": {"kind": "openai", "base_url": fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "ok", "model": "up"}]}},
    }


async def board_banners(url: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/prism/board.json") as response:
            board = await response.json()
    return [b["text"] for b in board["banners"] if b["kind"] == "budget"]


async def test_without_org_label_the_one_series_is_the_highest_organisation(
    prism_fake, prism_gateway, prism_plugin, caplog
):
    prism_plugin(Levels(), "test-levels")
    gw = await prism_gateway(catalog(prism_fake), load_plugins=["openai", "metrics"])
    for level in ("acme=0.5", "beta=0.9", "gamma=0.85", "beta=0.2"):
        await chat(gw.url, headers={"x-test-level": level})
    text = await scrape(gw.url)
    # beta came down: the highest is now gamma's, and no organisation is named.
    assert value(text, "prism_budget_used_ratio") == 0.85
    assert 'org="' not in text and "gamma" not in text
    assert value(text, "prism_limit_refusals_total") == 0
    assert caplog.text.count("prism_limit_refusals_total is a counter, not a gauge") == 1
    assert await board_banners(gw.url) == [
        "budget: 1 organisation at or above 80% of a budget (names with org_label, or for the "
        "admin)"
    ]


async def test_with_org_label_each_organisation_is_a_series_and_named_on_the_board(
    prism_fake, prism_gateway, prism_plugin
):
    prism_plugin(Levels(), "test-levels")
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"metrics": {"org_label": "true"}},
        load_plugins=["openai", "metrics"],
    )
    for level in ("acme=0.5", "beta=0.95", "gamma=1.3"):
        await chat(gw.url, headers={"x-test-level": level})
    text = await scrape(gw.url)
    assert value(text, "prism_budget_used_ratio", org="acme") == 0.5
    assert value(text, "prism_budget_used_ratio", org="gamma") == 1.3
    assert await board_banners(gw.url) == [
        "budget: gamma has used 130% of a budget",
        "budget: beta has used 95% of a budget",
    ]
