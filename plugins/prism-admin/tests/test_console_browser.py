"""The console in Debian's chromium (driven by playwright, as the board's tests do; nothing
downloads a browser): sign in with the token and with single sign-on, create an organisation and
a key, call the gateway with the key read off the page, set a budget and watch its bar move,
revoke the key and see the next call refused. Screenshots at 1280 and 390 pixels wide go to
$PRISM_TEST_ARTIFACTS/console (else the test's tmp_path/console)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from .conftest import ADMIN_TOKEN

CHROMIUM = os.environ.get("PRISM_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"no browser at {CHROMIUM} (.ci/run installs chromium)"
)
WIDTHS = {"wide": {"width": 1280, "height": 900}, "narrow": {"width": 390, "height": 844}}


def artifacts(tmp_path: Path) -> Path:
    where = Path(os.environ.get("PRISM_TEST_ARTIFACTS", tmp_path)) / "console"
    where.mkdir(parents=True, exist_ok=True)
    return where


async def shoot(page: Any, where: Path, name: str) -> None:
    """The current page at both widths (the layout must hold at 390 px: nothing wider)."""
    for size in WIDTHS.values():
        await page.set_viewport_size(size)
        overflow = await page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{name} at {size['width']} px is {overflow} px too wide"
        shot = where / f"{name}-{size['width']}.png"
        await page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 0
    await page.set_viewport_size(WIDTHS["wide"])
    print(f"console screenshots: {where}/{name}-*.png")


async def chat(gw: Any, key: str) -> int:
    client = gw.openai(api_key=key)
    try:
        await client.chat.completions.create(
            # A capped answer: the budget's reservation for it is small.
            model="m",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=16,
        )
    except openai.APIStatusError as exc:
        return exc.status_code
    finally:
        await client.close()
    return 200


@pytest.fixture
async def chromium() -> Any:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = await browser.new_context(viewport=WIDTHS["wide"])
            context.set_default_timeout(5000)
            await context.grant_permissions(["clipboard-read", "clipboard-write"])
            yield context
        finally:
            await browser.close()


async def test_with_the_token_a_key_lives_and_dies_in_the_console(console, chromium, tmp_path):
    where = artifacts(tmp_path)
    page = await chromium.new_page()
    loaded: list[str] = []
    page.on("request", lambda request: loaded.append(request.url))
    await page.goto(console.url + "/prism/console")
    await page.get_by_label("Admin token or admin API key").fill(ADMIN_TOKEN)
    await page.keyboard.press("Enter")  # the keyboard is enough
    await page.wait_for_selector("text=Signed in as admin")

    await page.get_by_label("New organisation's name").fill("acme")
    await page.get_by_role("button", name="Create organisation").click()
    await page.wait_for_selector("#status >> text=Organisation acme created")
    await page.get_by_label("Description").fill("console test")
    await page.get_by_role("button", name="Create key").click()
    secret = page.locator("#secret-text")
    await secret.wait_for()
    key = (await secret.inner_text()).strip()
    key_id = await secret.get_attribute("data-key-id")
    await page.get_by_role("button", name="Copy").click()
    await page.wait_for_selector("#status >> text=Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == key
    assert await chat(console, key) == 200
    await shoot(page, where, "keys")

    await page.get_by_role("link", name="Limits and budgets").click()
    # A key's own limit, then the organisation's budget; each listed where it was set.
    await page.get_by_label("Set on").select_option(f"key:{key_id}")
    await page.get_by_label("Setting", exact=True).fill("rpm")
    await page.get_by_label("Value (empty unsets it)").fill("50")
    await page.get_by_role("button", name="Save setting").click()
    await page.wait_for_selector(f"#limits >> text=key {key_id}")
    await page.get_by_label("Set on").select_option("org")
    await page.get_by_label("Setting", exact=True).fill("budget")
    await page.get_by_label("Value (empty unsets it)").fill("0.0003/day")
    await page.get_by_role("button", name="Save setting").click()
    bar = page.get_by_role("meter", name="organisation acme: 0.0003/day")
    await bar.wait_for()
    first = float(await bar.get_attribute("aria-valuenow") or "0")
    for _ in range(3):
        assert await chat(console, key) == 200
    for _ in range(50):  # the ledger commits in batches: look again until it has them
        await page.get_by_role("button", name="Refresh").click()
        await page.wait_for_selector("#status >> text=Budgets refreshed")
        if float(await bar.get_attribute("aria-valuenow") or "0") > first:
            break
        await page.wait_for_timeout(100)
    used = float(await bar.get_attribute("aria-valuenow") or "0")
    assert used > first
    # The key's rpm bar counts the calls of the last minute, as the limiter does.
    rpm = page.get_by_role("meter", name=f"key {key_id}: rpm 50")
    assert int(await rpm.get_attribute("aria-valuenow") or "0") >= 3
    width = await page.locator(".bar > span").first.evaluate("node => node.style.width")
    assert float(width.rstrip("%")) > 0
    await shoot(page, where, "budgets")

    await page.get_by_role("link", name="Usage").click()
    await page.get_by_role("button", name="Show usage").click()
    await page.wait_for_selector("#usage-chart svg rect")
    assert "m" in await page.locator(".legend").inner_text()
    await shoot(page, where, "usage")

    await page.get_by_role("link", name="Organisations and keys").click()
    # Disabling the organisation refuses its key at once; enabling it lets the key back.
    await page.get_by_role("button", name="Disable organisation").click()
    await page.wait_for_selector("#status >> text=Organisation acme disabled")
    assert await chat(console, key) == 403
    await page.get_by_role("button", name="Enable organisation").click()
    await page.wait_for_selector("#status >> text=Organisation acme enabled")
    assert await chat(console, key) == 200
    await page.get_by_role("button", name=f"Revoke key {key_id}").click()
    await page.wait_for_selector(f'tr[data-key="{key_id}"] .key-state >> text=revoked')
    assert await chat(console, key) == 401

    await page.get_by_role("link", name="Audit log").click()
    await page.wait_for_selector("#audit >> text=key.revoke")
    await shoot(page, where, "audit")
    # Nothing came from anywhere but the gateway.
    assert loaded and all(url.startswith(console.url) for url in loaded)


async def test_single_sign_on_in_the_browser_and_overrides(console, chromium, tmp_path):
    where = artifacts(tmp_path)
    page = await chromium.new_page()
    await page.goto(console.url + "/prism/console")
    await shoot(page, where, "sign-in")
    await page.get_by_role("link", name="Sign in with single sign-on").click()
    await page.wait_for_selector("text=Signed in as sso:ana@example.com")
    await page.get_by_role("link", name="Overrides").click()
    await page.wait_for_selector("#overrides caption")
    await shoot(page, where, "overrides")
    # Signing out ends the session: the admin API no longer takes the cookie.
    await page.get_by_role("button", name="Sign out").click()
    await page.wait_for_selector("text=Not signed in")
    cookies = {c["name"]: c for c in await chromium.cookies()}
    assert "prism_console" not in cookies or not cookies["prism_console"]["value"]
    async with aiohttp.ClientSession() as http:
        async with http.get(console.url + "/prism/console") as response:
            csp = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
