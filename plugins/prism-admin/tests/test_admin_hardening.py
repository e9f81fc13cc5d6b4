"""What a hostile client tries: wrong-type input (refused naming the field, nothing changed),
credentials echoed back (never), answers left in caches (never), an old session cookie kept
after signing in again (ended), and the session cookie's flags behind a TLS proxy."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from .conftest import ADMIN_TOKEN, ENV, start

CHAT = ["chat", "model:*"]


async def test_wrong_types_are_refused_naming_the_field(api):
    await api.ok("POST", "/orgs", json={"name": "acme"})
    key = await api.ok("POST", "/keys", json={"org": "acme", "scopes": CHAT})
    refusals = [
        ("POST", "/orgs", {"name": "x", "tags": "abc"}, "tags"),
        ("POST", "/orgs", {"name": "x", "tags": None}, "tags"),
        ("POST", "/orgs", {"name": "x", "settings": ["rpm"]}, "settings"),
        ("POST", "/orgs", {"name": 7}, "name"),
        ("PATCH", "/orgs/acme", {"disabled": "yes"}, "disabled"),
        ("PATCH", "/orgs/acme", {"settings": None}, "settings"),
        ("POST", "/keys", {"org": "acme", "scopes": "chat"}, "scopes"),
        ("POST", "/keys", {"org": ["acme"], "scopes": CHAT}, "org"),
        ("PATCH", f"/keys/{key['id']}", {"description": "x" * 201}, "description"),
        ("PATCH", f"/keys/{key['id']}", {"settings": {"rpm": 5}}, "settings.rpm"),
        ("PATCH", f"/keys/{key['id']}", {"expires_at": 123}, "expires_at"),
        ("PATCH", f"/keys/{key['id']}", {"expires_at": "2030-01-01T00:00:00"}, "expires_at"),
        ("POST", f"/keys/{key['id']}/rotate", {"grace_s": -1}, "grace_s"),
        ("POST", f"/keys/{key['id']}/rotate", {"grace_s": True}, "grace_s"),
        ("GET", "/audit?before=x", None, "before"),
        ("GET", "/usage?format=xml", None, "format"),
    ]
    for method, path, body, field in refusals:
        status, answer = await api.call(method, path, json=body)
        assert status == 400, (method, path, body, answer)
        assert answer["error"]["code"] == "invalid_request"
        assert answer["error"]["param"] == field, (method, path, body, answer)
        assert field.split(".")[-1] in answer["error"]["message"]
    status, answer = await api.call("POST", "/orgs", data=b"{not json", token=ADMIN_TOKEN)
    assert (status, answer["error"]["param"]) == (400, "body")
    assert [o["name"] for o in (await api.ok("GET", "/orgs"))["orgs"]] == ["acme"]
    assert (await api.ok("GET", f"/keys/{key['id']}"))["description"] is None
    assert [e["action"] for e in (await api.ok("GET", "/audit"))["entries"]] == [
        "key.create",
        "org.create",
    ]


async def test_credentials_are_never_echoed_and_answers_are_never_cached(api):
    await api.ok("POST", "/orgs", json={"name": "acme"})
    made = await api.call("POST", "/keys", json={"org": "acme", "scopes": ["admin"]})
    async with api.session.post(
        api.url + "/prism/admin/keys",
        json={"org": "acme", "scopes": CHAT},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status == 201
        assert response.headers["Cache-Control"] == "no-store"
    for wrong in (ADMIN_TOKEN + "x", ADMIN_TOKEN[:-1], made[1]["key"] + "x", "a" * 4096):
        status, answer = await api.call("GET", "/orgs", wrong)
        assert status == 401 and wrong not in json.dumps(answer)
        status, answer = await api.call("POST", "/session", None, json={"token": wrong})
        assert status == 401 and wrong not in json.dumps(answer)
    status, answer = await api.call("GET", "/orgs", None)
    assert status == 401


async def test_signing_in_again_ends_the_earlier_session(api):
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        url = api.url + "/prism/admin"
        async with http.post(url + "/session", json={"token": ADMIN_TOKEN}) as response:
            assert response.status == 200
        first = next(c.value for c in jar if c.key == "prism_console")
        async with http.post(url + "/session", json={"token": ADMIN_TOKEN}) as response:
            assert response.status == 200
        second = next(c.value for c in jar if c.key == "prism_console")
        assert first != second
        async with http.get(url + "/orgs") as response:
            assert response.status == 200
    async with aiohttp.ClientSession() as http:
        async with http.get(
            api.url + "/prism/admin/orgs", headers={"Cookie": f"prism_console={first}"}
        ) as response:
            assert response.status == 401


@pytest.fixture
async def tls_proxied(
    prism_gateway: Any,
    prism_fake: Any,
    prism_clock: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    monkeypatch.setenv(ENV, ADMIN_TOKEN)
    return await start(
        prism_gateway,
        prism_fake,
        prism_clock,
        tmp_path,
        {"db_path": "keys.db", "refresh_s": 0.05},
        admin={"cookie_secure": True, "session_s": 900},
    )


async def test_behind_a_tls_proxy_the_cookie_is_secure(tls_proxied):
    async with aiohttp.ClientSession() as http:
        async with http.post(
            tls_proxied.url + "/prism/admin/session", json={"token": ADMIN_TOKEN}
        ) as response:
            assert response.status == 200
            cookie = response.headers["Set-Cookie"]
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert {"secure", "httponly", "samesite=strict", "max-age=900"} <= flags


async def test_several_workers_without_shared_state_are_warned_about_sessions(api, caplog):
    from prism_admin import plugin

    caplog.set_level("WARNING", logger="prism.admin")
    assert plugin.prism_workers(api.gateway.gateway.current, 4) is None
    assert "console sessions are kept in each process" in caplog.text
