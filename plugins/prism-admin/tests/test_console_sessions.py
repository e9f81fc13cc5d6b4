"""The console's sign-in: a credential once for an HttpOnly, SameSite=Strict cookie; writes need
the CSRF token; sessions end on sign-out, on expiry and when their key is revoked. Single sign-on
against a real OpenID provider on a loopback port: its ID tokens verified, and every wrong one
(issuer, audience, expiry, signature, no role) refused with nobody signed in."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from .conftest import ADMIN_TOKEN


def browser() -> aiohttp.ClientSession:
    # unsafe: keep cookies for an IP address host (the gateway is on 127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def call(
    http: aiohttp.ClientSession, gw: Any, method: str, path: str, **kw: Any
) -> tuple[int, Any]:
    async with http.request(method, gw.url + "/prism/admin" + path, **kw) as response:
        return response.status, await response.json()


async def sign_in(http: aiohttp.ClientSession, gw: Any, token: str) -> tuple[int, Any, str]:
    async with http.post(gw.url + "/prism/admin/session", json={"token": token}) as response:
        return response.status, await response.json(), response.headers.get("Set-Cookie", "")


async def test_a_token_signs_in_once_and_the_cookie_carries_its_rights(console, prism_clock):
    async with browser() as http:
        status, me, cookie = await sign_in(http, console, ADMIN_TOKEN)
        assert status == 200 and me["who"] == "admin" and me["operator"] is True
        attrs = [part.strip().lower() for part in cookie.split(";")]
        assert cookie.startswith("prism_console=") and ADMIN_TOKEN not in cookie
        assert {"httponly", "samesite=strict", "path=/prism/", "max-age=600"} <= set(attrs)
        assert "secure" not in attrs  # plain HTTP here; over TLS it is Secure

        assert (await call(http, console, "GET", "/orgs"))[0] == 200
        # A write with the cookie but not the CSRF token is refused and changes nothing.
        status, answer = await call(http, console, "POST", "/orgs", json={"name": "acme"})
        assert (status, answer["error"]["code"]) == (403, "csrf_failed")
        status, answer = await call(
            http, console, "POST", "/orgs", json={"name": "acme"}, headers={"X-Prism-CSRF": "x"}
        )
        assert status == 403
        assert (await call(http, console, "GET", "/orgs"))[1]["orgs"] == []
        csrf = {"X-Prism-CSRF": me["csrf"]}
        assert (await call(http, console, "POST", "/orgs", json={"name": "acme"}, headers=csrf))[
            0
        ] == 201
        entry = (await call(http, console, "GET", "/audit"))[1]["entries"][0]
        assert (entry["action"], entry["actor"]) == ("org.create", "admin")

        # The session ends when it expires...
        prism_clock.advance(601)
        status, answer = await call(http, console, "GET", "/orgs")
        assert (status, answer["error"]["code"]) == (401, "unauthenticated")
        # ...and on sign-out.
        status, me, _ = await sign_in(http, console, ADMIN_TOKEN)
        assert (await call(http, console, "GET", "/session"))[1]["who"] == "admin"
        status, _ = await call(
            http, console, "DELETE", "/session", headers={"X-Prism-CSRF": me["csrf"]}
        )
        assert status == 200
        assert (await call(http, console, "GET", "/orgs"))[0] == 401


async def test_an_admin_key_signs_in_for_its_organisation_until_it_is_revoked(console):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with browser() as http:
        for name in ("acme", "other"):
            await call(http, console, "POST", "/orgs", json={"name": name}, headers=admin)
        status, boss = await call(
            http, console, "POST", "/keys", json={"org": "acme", "scopes": ["admin"]}, headers=admin
        )
        plain = (
            await call(
                http,
                console,
                "POST",
                "/keys",
                json={"org": "acme", "scopes": ["chat"]},
                headers=admin,
            )
        )[1]
    async with browser() as http:
        status, answer, cookie = await sign_in(http, console, plain["key"])
        assert (status, answer["error"]["code"], cookie) == (403, "forbidden", "")
        status, answer, cookie = await sign_in(http, console, "sk-prism-wrong")
        assert (status, answer["error"]["code"], cookie) == (401, "unauthenticated", "")
        async with http.post(console.url + "/prism/admin/session", data="token=x") as response:
            assert response.status == 415  # a cross-site form cannot sign anyone in

        status, me, _ = await sign_in(http, console, boss["key"])
        assert (me["who"], me["org"], me["operator"]) == (f"key:{boss['id']}", "acme", False)
        orgs = (await call(http, console, "GET", "/orgs"))[1]["orgs"]
        assert [o["name"] for o in orgs] == ["acme"]
        csrf = {"X-Prism-CSRF": me["csrf"]}
        status, answer = await call(
            http, console, "PATCH", "/orgs/acme", json={"tags": ["x"]}, headers=csrf
        )
        assert status == 403 and answer["error"]["code"] == "forbidden"
        status, made = await call(
            http, console, "POST", "/keys", json={"org": "acme", "scopes": ["chat"]}, headers=csrf
        )
        assert status == 201 and made["key"]
        assert (await call(http, console, "GET", "/overrides"))[0] == 403

        await call(http, console, "DELETE", f"/keys/{boss['id']}", headers=admin)
        status, answer = await call(http, console, "GET", "/orgs")
        assert status == 401  # the key it signed in with is revoked: so is the session


async def sso(http: aiohttp.ClientSession, gw: Any) -> tuple[int, str]:
    """A browser's single sign-on: the console's link, the provider, back to the console."""
    async with http.get(gw.url + "/prism/console/sso") as response:
        return response.status, await response.text()


async def test_single_sign_on_makes_the_person_the_actor(console, provider):
    async with browser() as http:
        status, page = await sso(http, console)
        assert status == 200 and "Prism console" in page  # back on the console, signed in
        status, me = await call(http, console, "GET", "/session")
        assert (status, me["who"], me["operator"]) == (200, "sso:ana@example.com", True)
        csrf = {"X-Prism-CSRF": me["csrf"]}
        await call(http, console, "POST", "/orgs", json={"name": "acme"}, headers=csrf)
        entry = (await call(http, console, "GET", "/audit"))[1]["entries"][0]
        assert (entry["action"], entry["actor"]) == ("org.create", "sso:ana@example.com")

    provider.email, provider.groups = "bo@elsewhere.org", ("acme-admins",)
    async with browser() as http:
        assert (await sso(http, console))[0] == 200
        me = (await call(http, console, "GET", "/session"))[1]
        assert (me["who"], me["org"], me["operator"]) == ("sso:bo@elsewhere.org", "acme", False)
        status, answer = await call(http, console, "GET", "/overrides")
        assert status == 403 and answer["error"]["code"] == "forbidden"


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        ({"mint": {"iss": "http://127.0.0.1:1/other"}}, "iss"),
        ({"mint": {"aud": "someone-else"}}, "aud"),
        ({"mint": {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}}, "exp"),
        ({"foreign_key": True}, "signature"),
        ({"mint": {"nonce": "replayed"}}, "nonce"),
        ({"email": "eve@nowhere.net"}, "no role"),
        ({"mint": {"email_verified": False}}, "not verified"),
    ],
)
async def test_a_wrong_id_token_signs_nobody_in(console, provider, wrong, says):
    for name, value in wrong.items():
        setattr(provider, name, value)
    async with browser() as http:
        status, page = await sso(http, console)
        assert status in (401, 403), page
        assert says in page.lower() or says in page
        assert provider.tokens_issued == 1  # the provider did answer: Prism refused it
        status, answer = await call(http, console, "GET", "/session")
        assert (status, answer["error"]["code"]) == (401, "unauthenticated")
        assert not [c for c in http.cookie_jar if c.key == "prism_console"]


async def test_a_callback_this_browser_did_not_start_is_refused(console, provider):
    async with browser() as http:
        async with http.get(
            console.url + "/prism/console/sso/callback?code=abc&state=xyz"
        ) as response:
            assert response.status == 400
        # A state from another browser's sign-in does not work in this one either.
        async with http.get(console.url + "/prism/console/sso", allow_redirects=False) as first:
            authorize = first.headers["Location"]
    async with browser() as other:
        async with other.get(authorize, allow_redirects=False) as back:
            callback = back.headers["Location"]
        async with other.get(callback) as response:
            assert response.status == 400
            assert (await call(other, console, "GET", "/session"))[0] == 401
