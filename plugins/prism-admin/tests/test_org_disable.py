"""Disabling an organisation through the admin API: the next call with any of its keys is
refused 403 ``org_disabled`` in both SDKs' error shapes, its administrators are refused too,
nothing new is made for it, other organisations carry on; enabling it again lets them all back.
Each change is audited."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import openai

from .conftest import ADMIN_TOKEN

CHAT = ["chat", "messages", "model:*"]


async def openai_call(api: Any, key: str) -> tuple[int, str | None, str]:
    client = api.gateway.openai(api_key=key)
    try:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}]
        )
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return exc.status_code, body.get("code"), str(body.get("message"))
    finally:
        await client.close()
    return 200, None, ""


async def anthropic_call(api: Any, key: str) -> tuple[int, str | None, str | None]:
    client = api.gateway.anthropic(api_key=key)
    try:
        await client.messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "hello"}]
        )
    except anthropic.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error") or {}
        return exc.status_code, error.get("code"), error.get("type")
    finally:
        await client.close()
    return 200, None, None


async def test_a_disabled_organisations_keys_are_refused_until_it_is_enabled(api):
    for org in ("acme", "beta"):
        await api.ok("POST", "/orgs", json={"name": org})
    key = (await api.ok("POST", "/keys", json={"org": "acme", "scopes": CHAT}))["key"]
    boss = await api.ok("POST", "/keys", json={"org": "acme", "scopes": ["admin"]})
    other = (await api.ok("POST", "/keys", json={"org": "beta", "scopes": CHAT}))["key"]
    assert (await openai_call(api, key))[0] == 200
    assert (await anthropic_call(api, key))[0] == 200

    disabled = await api.ok("DELETE", "/orgs/acme")
    assert disabled["disabled"] is True and disabled["disabled_at"]
    # The very next call: the admin API re-reads this gateway's keys after each write.
    status, code, message = await openai_call(api, key)
    assert (status, code) == (403, "org_disabled") and "acme" in message
    assert await anthropic_call(api, key) == (403, "org_disabled", "permission_error")
    # A wrong text for the same key id still learns nothing about the organisation.
    assert (await openai_call(api, key[:-4] + "AAAA"))[:2] == (401, "invalid_api_key")
    assert (await openai_call(api, other))[0] == 200

    # Its administrator is refused as well, and no key can be made for it.
    status, answer = await api.call("GET", "/keys", boss["key"])
    assert (status, answer["error"]["code"]) == (403, "org_disabled")
    status, answer = await api.call("POST", "/keys", json={"org": "acme", "scopes": CHAT})
    assert (status, answer["error"]["param"]) == (409, "org")
    # The operator still sees it, marked.
    listed = {o["name"]: o for o in (await api.ok("GET", "/orgs"))["orgs"]}
    assert listed["acme"]["disabled"] is True and listed["beta"]["disabled"] is False

    enabled = await api.ok("PATCH", "/orgs/acme", json={"disabled": False})
    assert enabled["disabled"] is False and enabled["disabled_at"] is None
    assert (await openai_call(api, key))[0] == 200
    assert (await anthropic_call(api, key))[0] == 200
    assert (await api.call("GET", "/keys", boss["key"]))[0] == 200

    actions = [e["action"] for e in (await api.ok("GET", "/audit?org=acme"))["entries"]]
    assert actions[:2] == ["org.enable", "org.disable"]


async def test_a_console_session_of_a_disabled_organisations_admin_is_refused(console):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = console.url + "/prism/admin"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        await http.post(base + "/orgs", json={"name": "acme"}, headers=admin)
        async with http.post(
            base + "/keys", json={"org": "acme", "scopes": ["admin"]}, headers=admin
        ) as response:
            boss = await response.json()
        async with http.post(base + "/session", json={"token": boss["key"]}) as response:
            assert response.status == 200
        async with http.get(base + "/orgs") as response:
            assert response.status == 200
        async with http.delete(base + "/orgs/acme", headers=admin) as response:
            assert response.status == 200
        async with http.get(base + "/orgs") as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == "org_disabled"
        async with http.patch(base + "/orgs/acme", json={"disabled": False}, headers=admin):
            pass
        async with http.get(base + "/orgs") as response:
            assert response.status == 200


async def test_key_settings_are_checked_by_their_declarations_naming_the_setting(console):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = console.url + "/prism/admin"
    async with aiohttp.ClientSession() as http:

        async def call(method: str, path: str, body: Any, headers: Any = admin) -> Any:
            async with http.request(method, base + path, json=body, headers=headers) as answer:
                return answer.status, await answer.json()

        await call("POST", "/orgs", {"name": "acme"})
        key = (await call("POST", "/keys", {"org": "acme", "scopes": CHAT}))[1]
        boss = (await call("POST", "/keys", {"org": "acme", "scopes": ["admin"]}))[1]
        refusals = [
            ({"rpm": "lots"}, "settings.rpm", "rpm"),
            ({"budget": "5 a day"}, "settings.budget", "budget"),
            ({"budget_mode@m": "soft"}, "settings.budget_mode@m", "model"),
            ({"regions": "eu"}, "settings.regions", "declared"),
        ]
        for settings, param, says in refusals:
            status, answer = await call("PATCH", f"/keys/{key['id']}", {"settings": settings})
            assert (status, answer["error"]["param"]) == (400, param), answer
            assert param in answer["error"]["message"] and says in answer["error"]["message"]
        assert (await call("GET", f"/keys/{key['id']}", None))[1]["settings"] == {}

        # An organisation's administrator sets its keys' limits (they apply inside the
        # organisation's), never the organisation's own.
        own = {"Authorization": f"Bearer {boss['key']}"}
        status, answer = await call("PATCH", f"/keys/{key['id']}", {"settings": {"rpm": "1"}}, own)
        assert status == 200 and answer["settings"] == {"rpm": "1"}
        status, answer = await call("PATCH", "/orgs/acme", {"settings": {"rpm": "1000"}}, own)
        assert (status, answer["error"]["code"]) == (403, "forbidden")

        class Gw:
            gateway = console

        assert (await openai_call(Gw, key["key"]))[0] == 200
        assert (await openai_call(Gw, key["key"]))[0] == 429  # the key's own rpm


async def test_limits_show_what_each_limit_has_left_now(console):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = console.url + "/prism/admin"
    async with aiohttp.ClientSession() as http:

        async def call(method: str, path: str, body: Any = None, headers: Any = admin) -> Any:
            async with http.request(method, base + path, json=body, headers=headers) as answer:
                return answer.status, await answer.json()

        await call("POST", "/orgs", {"name": "acme", "settings": {"rpm": "10", "tpm": "5000"}})
        await call("POST", "/orgs", {"name": "beta"})
        key = (await call("POST", "/keys", {"org": "acme", "scopes": CHAT}))[1]
        boss = (await call("POST", "/keys", {"org": "acme", "scopes": ["admin"]}))[1]
        other = (await call("POST", "/keys", {"org": "beta", "scopes": ["admin"]}))[1]
        await call("PATCH", f"/keys/{key['id']}", {"settings": {"max_parallel": "2"}})

        class Gw:
            gateway = console

        for _ in range(2):
            assert (await openai_call(Gw, key["key"]))[0] == 200
        status, answer = await call(
            "GET", "/limits?org=acme", headers={"Authorization": f"Bearer {boss['key']}"}
        )
        assert status == 200 and answer["live"] is True
        got = {(r["key"], r["limit"]): r for r in answer["limits"]}
        assert set(got) == {(None, "rpm"), (None, "tpm"), (key["id"], "max_parallel")}
        assert (got[None, "rpm"]["value"], got[None, "rpm"]["used"]) == (10, 2)
        assert got[None, "rpm"]["remaining"] == 8
        assert 0 < got[None, "tpm"]["used"] < 5000
        assert got[key["id"], "max_parallel"]["used"] == 0  # nothing in flight now
        status, answer = await call(
            "GET", "/limits?org=acme", headers={"Authorization": f"Bearer {other['key']}"}
        )
        assert (status, answer["error"]["code"]) == (403, "forbidden")
