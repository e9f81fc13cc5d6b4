"""Every endpoint by every credential gets exactly the documented answer; bad input is refused
naming the field and changes nothing; the OpenAPI document is valid and complete."""

from __future__ import annotations

import itertools
from typing import Any

from openapi_spec_validator import validate
from prism_admin.routes import BASE

CHAT = ["chat", "model:*"]
WHO = ("admin", "own", "other", "plain", "none")
_names = itertools.count()


async def setup(api: Any) -> dict[str, str | None]:
    for org in ("acme", "other"):
        await api.ok("POST", "/orgs", json={"name": org})
    own = await api.ok("POST", "/keys", json={"org": "acme", "scopes": ["admin", *CHAT]})
    other = await api.ok("POST", "/keys", json={"org": "other", "scopes": ["admin"]})
    plain = await api.ok("POST", "/keys", json={"org": "acme", "scopes": CHAT})
    return {
        "admin": "admin-token-for-tests",
        "own": own["key"],
        "other": other["key"],
        "plain": plain["key"],
        "none": None,
    }


async def fresh_key(api: Any) -> str:
    made = await api.ok("POST", "/keys", json={"org": "acme", "scopes": CHAT})
    return str(made["id"])


async def fresh_org(api: Any) -> str:
    name = f"org{next(_names)}"
    await api.ok("POST", "/orgs", json={"name": name})
    return name


OPERATOR = {"admin": 200, "own": 403, "other": 403, "plain": 403, "none": 401}
ORG = {"admin": 200, "own": 200, "other": 403, "plain": 403, "none": 401}
ANY_ADMIN = {"admin": 200, "own": 200, "other": 200, "plain": 403, "none": 401}

#: (method, path, body, expected status per credential); {key} and {org} are made fresh.
CASES: list[tuple[str, str, Any, dict[str, int]]] = [
    ("GET", "/orgs", None, ANY_ADMIN),
    ("POST", "/orgs", "new-org", {**OPERATOR, "admin": 201}),
    ("GET", "/orgs/acme", None, ORG),
    ("PATCH", "/orgs/acme", {"tags": ["t"]}, OPERATOR),
    ("DELETE", "/orgs/{org}", None, OPERATOR),
    ("GET", "/keys", None, ANY_ADMIN),
    ("GET", "/keys?org=acme", None, ORG),
    ("POST", "/keys", {"org": "acme", "scopes": CHAT}, {**ORG, "admin": 201, "own": 201}),
    ("GET", "/keys/{key}", None, ORG),
    ("PATCH", "/keys/{key}", {"description": "d"}, ORG),
    ("DELETE", "/keys/{key}", None, ORG),
    ("POST", "/keys/{key}/rotate", {"grace_s": 5}, ORG),
    ("GET", "/usage", None, ANY_ADMIN),
    ("GET", "/usage?org=acme", None, ORG),
    ("GET", "/audit", None, ANY_ADMIN),
    ("GET", "/audit?org=acme", None, ORG),
    ("GET", "/limits?org=acme", None, ORG),
    ("GET", "/budgets?org=acme", None, ORG),
    ("GET", "/openapi.json", None, dict.fromkeys(WHO, 200)),
]


async def test_every_endpoint_with_every_credential(api):
    tokens = await setup(api)
    for method, template, body, expected in CASES:
        for who in WHO:
            path = template
            if "{key}" in path:
                path = path.replace("{key}", await fresh_key(api))
            if "{org}" in path:
                path = path.replace("{org}", await fresh_org(api))
            payload = {"name": f"n{next(_names)}"} if body == "new-org" else body
            status, answer = await api.call(method, path, tokens[who], json=payload)
            assert status == expected[who], (method, path, who, status, answer)
            if status == 403:
                assert answer["error"]["code"] == "forbidden"
                assert answer["error"]["message"]  # names the missing right
            if status == 401:
                assert answer["error"]["code"] == "unauthenticated"


async def test_an_org_admin_sees_only_its_own_organisation(api):
    tokens = await setup(api)
    orgs = await api.ok("GET", "/orgs", tokens["own"])
    assert [o["name"] for o in orgs["orgs"]] == ["acme"]
    keys = await api.ok("GET", "/keys", tokens["own"])
    assert {k["org"] for k in keys["keys"]} == {"acme"}
    audit = await api.ok("GET", "/audit", tokens["own"])
    assert audit["entries"] and {e["org"] for e in audit["entries"]} == {"acme"}
    status, answer = await api.call(
        "POST", "/keys", tokens["own"], json={"org": "other", "scopes": CHAT}
    )
    assert status == 403 and "acme" in answer["error"]["message"]


async def test_bad_input_names_the_field_and_changes_nothing(api):
    await api.ok("POST", "/orgs", json={"name": "acme", "tags": ["a"]})
    before = await api.ok("GET", "/orgs/acme")
    refusals = [
        ("POST", "/orgs", {"name": "x", "colour": "red"}, "colour"),
        ("POST", "/orgs", {"name": "bad name!"}, "name"),
        ("POST", "/orgs", {"tags": []}, "name"),
        (
            "PATCH",
            "/orgs/acme",
            {"tags": ["b"], "settings": {"max_output_price": "lots"}},
            "settings.max_output_price",
        ),
        (
            "PATCH",
            "/orgs/acme",
            {"tags": ["b"], "settings": {"nonsense": "1"}},
            "settings.nonsense",
        ),
        ("PATCH", "/orgs/acme", {"tags": "b"}, "tags"),
        ("POST", "/keys", {"org": "acme", "scopes": ["nope"]}, "scopes"),
        ("POST", "/keys", {"org": "acme"}, "scopes"),
        ("POST", "/keys", {"org": "nobody", "scopes": CHAT}, "org"),
        ("POST", "/keys", {"org": "acme", "scopes": CHAT, "expires_at": "soon"}, "expires_at"),
        ("GET", "/audit?limit=0", None, "limit"),
        ("GET", "/usage?group_by=colour", None, "group_by"),
        ("GET", "/usage?since=yesterday", None, "since"),
        ("GET", "/keys?colour=red", None, "colour"),
    ]
    for method, path, body, field in refusals:
        status, answer = await api.call(method, path, json=body)
        assert status == 400, (path, body, answer)
        assert answer["error"]["param"] == field, (path, body, answer)
    assert await api.ok("GET", "/orgs/acme") == before
    assert [o["name"] for o in (await api.ok("GET", "/orgs"))["orgs"]] == ["acme"]
    assert (await api.ok("GET", "/keys"))["keys"] == []


async def test_the_openapi_document_is_valid_and_lists_exactly_the_routes(api):
    status, document = await api.call("GET", "/openapi.json", None)
    assert status == 200
    validate(document)
    documented = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    served = {
        (route.method, route.resource.canonical)
        for route in api.gateway.app.router.routes()
        # The routes this plugin adds (the core has /prism/admin/reload of its own).
        if route.resource is not None and route.handler.__module__ == "prism_admin.routes"
    }
    assert documented == served
    assert all(path.startswith(BASE + "/") for _, path in documented)
    assert len(documented) >= 14
