"""The admin API's routes: one table, served by :func:`add_routes` and documented by
:mod:`.openapi` from the same entries, so the two cannot drift apart."""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from aiohttp import web

from prism_proxy import (
    GATEWAY,
    KEY_ADMIN,
    USAGE,
    KeyAdmin,
    PrismError,
    UsageQuery,
    UsageReport,
    error_response,
)

from .access import Credential, authenticate
from .body import bad, json_body, query_int, reject_unknown
from .budgets import budgets, limits
from .overrides_api import create_override, list_overrides, release_override
from .session_api import sign_in, sign_out, who_am_i

__all__ = ["BASE", "ROUTES", "Route", "add_routes"]

BASE = "/prism/admin"
MAX_GRACE_S = 30 * 86400
USAGE_DIMENSIONS = ("org", "key", "model", "day", "hour")

Handler = Callable[[web.Request, Credential], Awaitable[web.StreamResponse]]


@attrs.frozen
class Route:
    method: str
    path: str
    handler: Handler | None
    summary: str
    #: Who may call it: "operator", "org" (an admin key for its own organisation too), "open",
    #: "session" (open: the credential is the body, exchanged for a session cookie).
    access: str
    #: The request body's schema name in the document (None: no body).
    body: str | None = None
    #: The answer's schema name, and its status.
    answer: str | None = None
    status: int = 200
    query: tuple[str, ...] = ()


def _keys(request: web.Request) -> KeyAdmin:
    found = request.app[GATEWAY].current.services.get(KEY_ADMIN)
    if found is None:
        raise PrismError(
            404, "keys_off", "no plugin administers keys: install and configure prism-keys"
        )
    return found


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _time(field: str, given: Any) -> float | None:
    """An RFC 3339 time (``2030-01-01T00:00:00Z``) as Unix seconds; null stays null."""
    if given is None:
        return None
    if not isinstance(given, str):
        raise bad(field, f"{field}: expected an RFC 3339 time like 2030-01-01T00:00:00Z or null")
    try:
        parsed = datetime.datetime.fromisoformat(given.replace("Z", "+00:00"))
    except ValueError:
        raise bad(field, f"{field}: {given!r} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise bad(field, f"{field}: give the time zone (Z for UTC)")
    return parsed.timestamp()


# --- organisations ---


async def list_orgs(request: web.Request, who: Credential) -> web.StreamResponse:
    return _json({"orgs": await _keys(request).list_orgs(who.org)})


async def create_org(request: web.Request, who: Credential) -> web.StreamResponse:
    who.require_operator("creating an organisation")
    body = await json_body(request, ("name", "tags", "settings"), ("name",))
    if not isinstance(body["name"], str):
        raise bad("name", "name: expected text")
    record = await _keys(request).create_org(
        body["name"], body.get("tags", []), body.get("settings", {}), who.actor
    )
    return _json(record, 201)


async def _org_of(request: web.Request, who: Credential) -> tuple[KeyAdmin, str]:
    name = request.match_info["name"]
    who.require_org(name)
    return _keys(request), name


async def get_org(request: web.Request, who: Credential) -> web.StreamResponse:
    keys, name = await _org_of(request, who)
    record = await keys.get_org(name)
    if record is None:
        raise PrismError(404, "not_found", f"no organisation {name!r}")
    return _json(record)


async def update_org(request: web.Request, who: Credential) -> web.StreamResponse:
    who.require_operator("changing an organisation (tags, settings, limits, budgets)")
    keys, name = await _org_of(request, who)
    body = await json_body(request, ("tags", "settings", "disabled"))
    return _json(await keys.update_org(name, body, who.actor))


async def disable_org(request: web.Request, who: Credential) -> web.StreamResponse:
    who.require_operator("disabling an organisation")
    keys, name = await _org_of(request, who)
    return _json(await keys.update_org(name, {"disabled": True}, who.actor))


# --- keys ---

_KEY_FIELDS = ("scopes", "settings", "expires_at", "description", "owner")


def _key_fields(body: dict[str, Any]) -> dict[str, Any]:
    if "expires_at" in body:
        body["expires_at"] = _time("expires_at", body["expires_at"])
    return body


async def list_keys(request: web.Request, who: Credential) -> web.StreamResponse:
    reject_unknown(request.query, ("org",))
    org = request.query.get("org", who.org)
    who.require_org(org)
    return _json({"keys": await _keys(request).list_keys(org)})


async def create_key(request: web.Request, who: Credential) -> web.StreamResponse:
    body = await json_body(request, ("org", *_KEY_FIELDS), ("org", "scopes"))
    org = body.pop("org")
    if not isinstance(org, str):
        raise bad("org", "org: expected text")
    who.require_org(org)
    made = await _keys(request).create_key(org, _key_fields(body), who.actor)
    # The key's text, this once: it is stored nowhere.
    return _json({**made.record, "key": made.key}, 201)


async def _key_of(request: web.Request, who: Credential) -> tuple[KeyAdmin, str]:
    keys, key_id = _keys(request), request.match_info["id"]
    record = await keys.get_key(key_id)
    if record is None:
        raise PrismError(404, "not_found", f"no key {key_id!r}")
    who.require_org(record["org"])
    return keys, key_id


async def get_key(request: web.Request, who: Credential) -> web.StreamResponse:
    keys, key_id = await _key_of(request, who)
    return _json(await keys.get_key(key_id))


async def update_key(request: web.Request, who: Credential) -> web.StreamResponse:
    keys, key_id = await _key_of(request, who)
    body = await json_body(request, _KEY_FIELDS)
    return _json(await keys.update_key(key_id, _key_fields(body), who.actor))


async def revoke_key(request: web.Request, who: Credential) -> web.StreamResponse:
    keys, key_id = await _key_of(request, who)
    return _json(await keys.revoke_key(key_id, who.actor))


async def rotate_key(request: web.Request, who: Credential) -> web.StreamResponse:
    keys, key_id = await _key_of(request, who)
    body = await json_body(request, ("grace_s",))
    grace = body.get("grace_s", 0)
    if (
        isinstance(grace, bool)
        or not isinstance(grace, int | float)
        or not 0 <= grace <= MAX_GRACE_S
    ):
        raise bad("grace_s", f"grace_s: expected seconds from 0 to {MAX_GRACE_S}")
    made = await keys.rotate_key(key_id, float(grace), who.actor)
    return _json({**made.record, "key": made.key})


# --- usage and audit ---

_USAGE_PARAMS = ("since", "until", "group_by", "org", "key", "model", "format")


async def usage(request: web.Request, who: Credential) -> web.StreamResponse:
    query = request.query
    reject_unknown(query, _USAGE_PARAMS)
    org = query.get("org", who.org)
    who.require_org(org)
    days: dict[str, str | None] = {}
    for name in ("since", "until"):
        text = query.get(name)
        if text is not None:
            try:
                datetime.date.fromisoformat(text)
            except ValueError:
                raise bad(name, f"{name}: expected a UTC day as YYYY-MM-DD, got {text!r}") from None
        days[name] = text
    group_by = tuple(p.strip() for p in query.get("group_by", "org,key,model,day").split(","))
    for part in group_by:
        if part not in USAGE_DIMENSIONS:
            raise bad(
                "group_by", f"group_by: unknown {part!r} (known: {', '.join(USAGE_DIMENSIONS)})"
            )
    if len(set(group_by)) != len(group_by) or {"day", "hour"} <= set(group_by):
        raise bad("group_by", "group_by: a dimension twice, or both day and hour")
    form = query.get("format", "json")
    if form not in ("json", "csv"):
        raise bad("format", "format: expected json or csv")
    report: UsageReport | None = request.app[GATEWAY].current.services.get(USAGE)
    if report is None:
        raise PrismError(
            404, "billing_off", "no ledger to read usage from: configure prism-billing's ledger"
        )
    groups, total = await report.usage(
        UsageQuery(
            since=days["since"],
            until=days["until"],
            group_by=group_by,
            org=org,
            key_id=query.get("key"),
            model=query.get("model"),
        )
    )
    if form == "csv":
        out = io.StringIO()
        fields = list(groups[0]) if groups else [*group_by, *total]
        writer = csv.DictWriter(out, fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(groups)
        return web.Response(text=out.getvalue(), content_type="text/csv")
    return _json(
        {"currency": report.currency, "group_by": list(group_by), "groups": groups, "total": total}
    )


async def audit(request: web.Request, who: Credential) -> web.StreamResponse:
    query = request.query
    reject_unknown(query, ("org", "limit", "before"))
    org = query.get("org", who.org)
    who.require_org(org)
    limit = query_int(query, "limit", 100, low=1, high=1000)
    before = query_int(query, "before", None, low=1, high=2**62)
    entries = await _keys(request).audit(org=org, limit=limit or 100, before=before)
    return _json({"entries": entries})


async def openapi(request: web.Request, who: Credential) -> web.StreamResponse:
    from .openapi import document

    return _json(document())


ROUTES: tuple[Route, ...] = (
    Route("GET", "/orgs", list_orgs, "List organisations", "org", answer="OrgList"),
    Route(
        "POST",
        "/orgs",
        create_org,
        "Create an organisation",
        "operator",
        "OrgCreate",
        "Organisation",
        201,
    ),
    Route("GET", "/orgs/{name}", get_org, "Get an organisation", "org", answer="Organisation"),
    Route(
        "PATCH",
        "/orgs/{name}",
        update_org,
        "Change an organisation",
        "operator",
        "OrgUpdate",
        "Organisation",
    ),
    Route(
        "DELETE",
        "/orgs/{name}",
        disable_org,
        "Disable an organisation",
        "operator",
        answer="Organisation",
    ),
    Route("GET", "/keys", list_keys, "List keys", "org", answer="KeyList", query=("org",)),
    Route(
        "POST",
        "/keys",
        create_key,
        "Create a key (its text is answered once)",
        "org",
        "KeyCreate",
        "NewKey",
        201,
    ),
    Route("GET", "/keys/{id}", get_key, "Get a key", "org", answer="Key"),
    Route("PATCH", "/keys/{id}", update_key, "Change a key", "org", "KeyUpdate", "Key"),
    Route("DELETE", "/keys/{id}", revoke_key, "Revoke a key", "org", answer="Key"),
    Route(
        "POST",
        "/keys/{id}/rotate",
        rotate_key,
        "Rotate a key (new text; the old one works for grace_s)",
        "org",
        "KeyRotate",
        "NewKey",
    ),
    Route(
        "GET",
        "/usage",
        usage,
        "Usage from the ledger, as JSON or CSV",
        "org",
        answer="Usage",
        query=_USAGE_PARAMS,
    ),
    Route(
        "GET",
        "/audit",
        audit,
        "The audit log, newest first",
        "org",
        answer="AuditList",
        query=("org", "limit", "before"),
    ),
    Route(
        "GET",
        "/budgets",
        budgets,
        "An organisation's budgets and its keys', used and remaining this period",
        "org",
        answer="BudgetList",
        query=("org",),
    ),
    Route(
        "GET",
        "/limits",
        limits,
        "What each limit (rpm, tpm, max_parallel, budget) of an organisation and its keys "
        "has left now",
        "org",
        answer="LimitList",
        query=("org",),
    ),
    Route(
        "GET",
        "/overrides",
        list_overrides,
        "The breaker's active overrides",
        "operator",
        answer="OverrideList",
    ),
    Route(
        "POST",
        "/overrides",
        create_override,
        "Quarantine or cap a binding, provider or model",
        "operator",
        "OverrideCreate",
        "Override",
        201,
    ),
    Route(
        "POST",
        "/overrides/{id}/release",
        release_override,
        "End an override",
        "operator",
        "OverrideRelease",
        "Override",
    ),
    Route(
        "POST",
        "/session",
        sign_in,
        "Sign the console in: a credential once, for a session cookie",
        "session",
        "SignIn",
        "Session",
    ),
    Route(
        "GET",
        "/session",
        who_am_i,
        "Who is signed in (and the CSRF token)",
        "org",
        answer="Session",
    ),
    Route("DELETE", "/session", sign_out, "Sign the console out", "org", answer="SignedOut"),
    Route("GET", "/openapi.json", openapi, "This document", "open"),
)


def _wrap(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    handler = route.handler
    assert handler is not None

    async def serve(request: web.Request) -> web.StreamResponse:
        response: web.StreamResponse
        try:
            if route.access in ("open", "session"):
                response = await handler(request, Credential())
            else:
                keys = request.app[GATEWAY].current.services.get(KEY_ADMIN)
                who = await authenticate(request, keys)
                response = await handler(request, who)
        except PrismError as err:
            response = error_response(err, request=request)
        # Answers hold a new key's text, CSRF tokens, usage: no cache keeps any of them.
        response.headers["Cache-Control"] = "no-store"
        return response

    return serve


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, BASE + route.path, _wrap(route))
