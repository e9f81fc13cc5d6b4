"""GET /prism/board: tiles by region and model, live over Server-Sent Events, in a real browser."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import aiohttp
import orjson
import pytest
from prism_fake_upstream import Fault

from .conftest import chat

CHROMIUM = os.environ.get("PRISM_CHROMIUM", "/usr/bin/chromium")
ADMIN_ENV = "PRISM_BOARD_TEST_ADMIN"
ADMIN_TOKEN = "board-admin-token"


def catalog(fake) -> dict:
    return {
        "providers": {n: {"kind": "openai", "base_url": fake.base_url(n)} for n in ("x", "ok")},
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": "x", "model": "up-x", "region": "eu-west-1"},
                    {"provider": "ok", "model": "up-ok", "region": "us-east-1"},
                ],
            },
            "other": {"chain": [{"provider": "ok", "model": "up-ok", "region": "us-east-1"}]},
        },
    }


async def board_gateway(prism_gateway, fake, monkeypatch, **options):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    return await prism_gateway(
        catalog(fake),
        config={"admin_token_env": ADMIN_ENV},
        sections={"breaker": {"policies": "consecutive", "consecutive_failures": 3}},
        load_plugins=["openai", "breaker", "metrics"],
        **options,
    )


async def trip_x(fake, url: str) -> None:
    fake.script("x", [Fault(status=500)] * 3)
    for _ in range(3):
        assert (await chat(url)).status == 200


async def quarantine_x(url: str, **fields: str) -> None:
    """Quarantine x/up-x through the admin API, as the owner ``ana``."""
    body = {"kind": "quarantine", "scope": "binding", "target": "x/up-x", "owner": "ana", **fields}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/prism/breaker/overrides",
            json=body,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response:
            assert response.status == 201


async def next_board(response: aiohttp.ClientResponse) -> dict:
    """The next ``board`` event of an SSE stream."""
    event, data = None, []
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data.append(line.split(":", 1)[1].removeprefix(" "))
        elif not line and data:
            if event == "board":
                return orjson.loads("\n".join(data))
            event, data = None, []
    raise AssertionError("the stream ended")


def tile(board: dict, region: str, model: str, binding: str) -> dict:
    r = next(r for r in board["regions"] if r["region"] == region)
    m = next(m for m in r["models"] if m["model"] == model)
    return next(t for t in m["tiles"] if t["binding"] == binding)


async def test_the_feed_pushes_a_trip_without_being_asked(prism_fake, prism_gateway, monkeypatch):
    gw = await board_gateway(prism_gateway, prism_fake, monkeypatch)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/board/events") as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = await next_board(response)
            assert [r["region"] for r in first["regions"]] == ["eu-west-1", "us-east-1"]
            assert tile(first, "eu-west-1", "m", "x/up-x")["colour"] == "grey"  # no traffic yet
            assert len(first["regions"][1]["models"]) == 2  # ok/up-ok serves m and other
            loop = asyncio.get_running_loop()
            tripped_at = loop.time()
            await trip_x(prism_fake, gw.url)
            while True:
                board = await asyncio.wait_for(next_board(response), 5)
                x = tile(board, "eu-west-1", "m", "x/up-x")
                if x["colour"] == "red":
                    break
            assert loop.time() - tripped_at < 1.5
            assert x["state"] == "isolated" and "3 consecutive failures" in x["cause"]
            assert 0 < x["left_s"] <= 30
            assert x["error_rate"] == 0.0  # the window starts afresh after a trip


async def test_owners_and_reasons_only_for_the_admin(prism_fake, prism_gateway, monkeypatch):
    gw = await board_gateway(prism_gateway, prism_fake, monkeypatch)
    await quarantine_x(gw.url, reason="vendor says so")
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/board.json") as response:
            public = await response.json()
        cookies = {"prism_board_token": ADMIN_TOKEN}
        async with aiohttp.ClientSession(cookies=cookies) as admin:
            async with admin.get(gw.url + "/prism/board.json") as response:
                private = await response.json()
    quarantined = tile(public, "eu-west-1", "m", "x/up-x")
    assert quarantined["colour"] == "red" and quarantined["state"] == "quarantined"
    assert "vendor says so" not in orjson.dumps(public).decode() and "ana" not in str(public)
    override = tile(private, "eu-west-1", "m", "x/up-x")["overrides"][0]
    assert (override["reason"], override["owner"]) == ("vendor says so", "ana")


async def test_the_page_fetches_nothing_from_elsewhere(prism_fake, prism_gateway, monkeypatch):
    gw = await board_gateway(prism_gateway, prism_fake, monkeypatch)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/board") as response:
            html = await response.text()
            csp = response.headers["Content-Security-Policy"]
    assert "EventSource" in html and "http://" not in html and "https://" not in html
    assert "<script src" not in html and "<link" not in html
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp


@pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"no browser at {CHROMIUM} (.ci/run installs chromium)"
)
async def test_in_a_browser_a_tripped_binding_turns_red_without_a_reload(
    prism_fake, prism_gateway, monkeypatch, tmp_path: Path
):
    from playwright.async_api import async_playwright

    gw = await board_gateway(prism_gateway, prism_fake, monkeypatch)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1100, "height": 520})
            loaded: list[str] = []
            page.on("request", lambda request: loaded.append(request.url))
            await page.goto(gw.url + "/prism/board")
            x_tile = page.locator('.tile[data-binding="x/up-x"]')
            await x_tile.wait_for(timeout=5000)
            assert "grey" in (await x_tile.get_attribute("class") or "")
            navigations = len([u for u in loaded if u.endswith("/prism/board")])

            # Some traffic for the error-rate row, then the trip, through the gateway.
            for _ in range(2):
                await chat(gw.url)
            await trip_x(prism_fake, gw.url)
            await page.wait_for_selector('.tile.red[data-binding="x/up-x"]', timeout=2000)
            assert "isolated" in await x_tile.inner_text()
            stats = page.locator('.stats[data-binding="x/up-x"]')
            assert "errors" in await stats.inner_text()
            # Still the first page load: the tile turned red through the feed.
            assert len([u for u in loaded if u.endswith("/prism/board")]) == navigations == 1
            assert all(u.startswith(gw.url) for u in loaded)

            # For the test log: PRISM_TEST_ARTIFACTS keeps it past the run.
            shot = Path(os.environ.get("PRISM_TEST_ARTIFACTS", tmp_path)) / "board.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(shot), full_page=True)
            print(f"board screenshot: {shot}")
            assert shot.stat().st_size > 0
        finally:
            await browser.close()


class Clock:
    """The gateway's injected clock: the breaker's isolation ends when the test says."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"no browser at {CHROMIUM} (.ci/run installs chromium)"
)
async def test_in_a_browser_a_trial_without_traffic_says_it_is_waiting(
    prism_fake, prism_gateway, monkeypatch
):
    from playwright.async_api import async_playwright

    clock = Clock()
    gw = await board_gateway(prism_gateway, prism_fake, monkeypatch, clock=clock, sleep=clock.sleep)
    await trip_x(prism_fake, gw.url)
    clock.now += 31  # past isolation_s: the next look finds x/up-x in trial, and no call yet
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/board.json") as response:
            x = tile(await response.json(), "eu-west-1", "m", "x/up-x")
    assert (x["state"], x["calls"], x["trial"]["successes"]) == ("trial", 0, 0)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.goto(gw.url + "/prism/board")
            x_tile = page.locator('.tile.yellow[data-binding="x/up-x"]')
            await x_tile.wait_for(timeout=5000)
            shown = await x_tile.inner_text()
            stats = await page.locator('.stats[data-binding="x/up-x"]').inner_text()
        finally:
            await browser.close()
    # Not "trial 0/5 successes, 0/60 s": a trial that looks stuck while it waits for calls.
    assert shown.splitlines() == [
        "x/up-x",
        "trial: waiting for traffic",
        "needs 5 successes over 60 s",
    ]
    assert stats.splitlines() == [
        "errors: no calls in the last 60 s",  # not "0.0% of 0"
        "first token: no samples yet",
    ]


async def test_an_override_due_for_review_soon_is_a_banner_and_a_metric(
    prism_fake, prism_gateway, monkeypatch
):
    from .conftest import scrape, value

    gw = await board_gateway(prism_gateway, prism_fake, monkeypatch)
    await quarantine_x(gw.url, reason="r", review_by="3h")
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/board.json") as response:
            board = await response.json()
    (banner,) = [b for b in board["banners"] if b["kind"] == "review"]
    assert "x/up-x is due for review" in banner["text"]
    text = await scrape(gw.url)
    assert value(text, "prism_override_reviews", when="due_soon") == 1
    assert value(text, "prism_override_reviews", when="overdue") == 0
