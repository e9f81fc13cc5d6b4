"""With the fleet's shared state (prism-redis), console sessions and single sign-ons under way
live in Redis: a browser signed in on one gateway is signed in on the others, a sign-in started on
one finishes on another, and signing out on one ends the session everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest

from .conftest import ADMIN_TOKEN, ENV, ROLES, SECRET_ENV, start
from .oidc_provider import Provider


@pytest.fixture
async def pair(
    prism_gateway: Any,
    prism_fake: Any,
    prism_clock: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prism_redis: Any,
    provider: Provider,
) -> list[Any]:
    monkeypatch.setenv(ENV, ADMIN_TOKEN)
    monkeypatch.setenv(SECRET_ENV, provider.client_secret)
    gateways = []
    for _ in range(2):  # one fleet: the same Redis, the same key prefix
        gateways.append(
            await start(
                prism_gateway,
                prism_fake,
                prism_clock,
                tmp_path,
                {"db_path": "keys.db", "refresh_s": 0.05},
                plugins=("redis",),
                extra={"redis": {"url": prism_redis.url, "key_prefix": prism_redis.prefix}},
                admin={
                    "session_s": 600,
                    "oidc_issuer": provider.url,
                    "client_id": provider.client_id,
                    "client_secret_env": SECRET_ENV,
                    "roles": ROLES,
                },
            )
        )
    return gateways


def browser() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def me(http: aiohttp.ClientSession, gw: Any) -> tuple[int, Any]:
    async with http.get(gw.url + "/prism/admin/session") as response:
        return response.status, await response.json()


async def test_a_session_made_on_one_gateway_works_on_the_other(pair):
    first, second = pair
    async with browser() as http:
        async with http.post(
            first.url + "/prism/admin/session", json={"token": ADMIN_TOKEN}
        ) as response:
            assert response.status == 200
            csrf = (await response.json())["csrf"]
        status, who = await me(http, second)
        assert (status, who["who"], who["csrf"]) == (200, "admin", csrf)
        async with http.post(
            second.url + "/prism/admin/orgs",
            json={"name": "acme"},
            headers={"X-Prism-CSRF": csrf},
        ) as response:
            assert response.status == 201
        value = next(c.value for c in http.cookie_jar if c.key == "prism_console")
        async with http.delete(
            second.url + "/prism/admin/session", headers={"X-Prism-CSRF": csrf}
        ) as response:
            assert response.status == 200
        assert (await me(http, first))[0] == 401
    # The session itself is gone, not only the browser's cookie.
    cookie = {"Cookie": f"prism_console={value}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(first.url + "/prism/admin/session", headers=cookie) as response:
            assert response.status == 401


async def test_a_single_sign_on_started_on_one_gateway_finishes_on_the_other(pair):
    first, second = pair
    async with browser() as http:
        async with http.get(first.url + "/prism/console/sso", allow_redirects=False) as response:
            authorize = response.headers["Location"]
        async with http.get(authorize, allow_redirects=False) as response:
            callback = urlsplit(response.headers["Location"])
        # The provider sends the browser back; a load balancer hands it to the other gateway.
        other = urlsplit(second.url)
        async with http.get(urlunsplit(callback._replace(netloc=other.netloc))) as response:
            assert response.status == 200
        status, who = await me(http, first)
        assert (status, who["who"]) == (200, "sso:ana@example.com")
