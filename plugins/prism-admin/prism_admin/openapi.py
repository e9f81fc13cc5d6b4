"""The admin API's OpenAPI 3.1 document, built from the route table (:data:`.routes.ROUTES`)."""

from __future__ import annotations

import re
from typing import Any

from .routes import BASE, ROUTES, Route

__all__ = ["SCHEMAS", "document"]

_TEXT = {"type": "string"}
_NULLABLE_TEXT = {"type": ["string", "null"]}
_TIME = {"type": ["string", "null"], "format": "date-time"}
_SETTINGS = {
    "type": "object",
    "description": "Declared settings (prism_org_settings) as text, e.g. budget: 100/day; "
    "null unsets one.",
    "additionalProperties": {"type": ["string", "null"]},
}
_TAGS = {"type": "array", "items": _TEXT}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_KEY = {
    "id": _TEXT,
    "prefix": _TEXT,
    "org": _TEXT,
    "scopes": _TAGS,
    "settings": _SETTINGS,
    "created": _TEXT,
    "last_used": _TIME,
    "expires_at": _TIME,
    "expired": {"type": "boolean"},
    "revoked": _TIME,
    "previous_text_until": _TIME,
    "description": _NULLABLE_TEXT,
    "owner": _NULLABLE_TEXT,
}
_KEY_WRITE = {
    "scopes": _TAGS,
    "settings": _SETTINGS,
    "expires_at": _TIME,
    "description": _NULLABLE_TEXT,
    "owner": _NULLABLE_TEXT,
}
_ORG = {
    "name": _TEXT,
    "tags": _TAGS,
    "settings": _SETTINGS,
    "created": _TEXT,
    "disabled": {"type": "boolean"},
    "disabled_at": _TIME,
    "active_keys": {"type": "integer"},
}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"code": _TEXT, "message": _TEXT, "param": _NULLABLE_TEXT},
            }
        },
    },
    "Organisation": _closed(_ORG),
    "OrgList": _closed({"orgs": {"type": "array", "items": _ref("Organisation")}}),
    "OrgCreate": _closed({"name": _TEXT, "tags": _TAGS, "settings": _SETTINGS}, ("name",)),
    "OrgUpdate": _closed({"tags": _TAGS, "settings": _SETTINGS, "disabled": {"type": "boolean"}}),
    "Key": _closed(_KEY),
    "KeyList": _closed({"keys": {"type": "array", "items": _ref("Key")}}),
    "NewKey": _closed(
        {**_KEY, "key": {"type": "string", "description": "The key's text: shown this once."}}
    ),
    "KeyCreate": _closed({"org": _TEXT, **_KEY_WRITE}, ("org", "scopes")),
    "KeyUpdate": _closed(_KEY_WRITE),
    "KeyRotate": _closed({"grace_s": {"type": "number", "minimum": 0}}),
    "Usage": {
        "type": "object",
        "properties": {
            "currency": _TEXT,
            "group_by": _TAGS,
            "groups": {"type": "array", "items": {"type": "object"}},
            "total": {"type": "object"},
        },
    },
    "AuditEntry": _closed(
        {
            "id": {"type": "integer"},
            "at": _TEXT,
            "actor": _TEXT,
            "action": _TEXT,
            "org": _NULLABLE_TEXT,
            "subject": _TEXT,
            "before": {"type": ["object", "null"]},
            "after": {"type": ["object", "null"]},
            "address": _NULLABLE_TEXT,
        }
    ),
    "AuditList": _closed({"entries": {"type": "array", "items": _ref("AuditEntry")}}),
    "Override": _closed(
        {
            "id": _TEXT,
            "kind": {"enum": ["quarantine", "cap"]},
            "scope": {"enum": ["binding", "provider", "model"]},
            "target": _TEXT,
            "created": _TEXT,
            "review_by": _TEXT,
            "review_overdue": {"type": "boolean"},
            "max_in_flight": {"type": ["integer", "null"]},
            "expires": _TIME,
            "expired": {"type": "boolean"},
            "reason": _TEXT,
            "owner": _TEXT,
        }
    ),
    "OverrideList": _closed(
        {
            "overrides": {"type": "array", "items": _ref("Override")},
            "overdue_reviews": _TAGS,
        }
    ),
    "OverrideCreate": _closed(
        {
            "kind": {"enum": ["quarantine", "cap"]},
            "scope": {"enum": ["binding", "provider", "model"]},
            "target": _TEXT,
            "reason": _TEXT,
            "owner": {"type": "string", "description": "Default: who makes it (admin, sso:EMAIL)."},
            "review_by": {
                "type": "string",
                "description": "A duration (36h, 7d) or an ISO 8601 time; the breaker's "
                "review_default_s otherwise.",
            },
            "max_in_flight": {"type": "integer", "minimum": 0, "description": "A cap's limit."},
            "expires": {"type": "string", "description": "When a cap ends (as review_by)."},
        },
        ("kind", "scope", "target", "reason"),
    ),
    "OverrideRelease": _closed({"owner": _TEXT, "reason": _TEXT}),
    "SignIn": _closed(
        {"token": {"type": "string", "description": "The admin token or an admin key."}},
        ("token",),
    ),
    "Session": _closed(
        {
            "who": {"type": "string", "description": "admin, key:ID or sso:EMAIL"},
            "org": _NULLABLE_TEXT,
            "operator": {"type": "boolean"},
            "csrf": {
                "type": ["string", "null"],
                "description": "Send it as X-Prism-CSRF with every write made with the cookie.",
            },
            "expires": _TEXT,
        }
    ),
    "SignedOut": _closed({"signed_out": {"type": "boolean"}}),
    "Budget": _closed(
        {
            "org": _TEXT,
            "key": _NULLABLE_TEXT,
            "model": _NULLABLE_TEXT,
            "budget": _TEXT,
            "amount": _TEXT,
            "period": {"enum": ["hour", "day", "week", "month", "total"]},
            "since": _TIME,
            "used": _TEXT,
            "remaining": _TEXT,
            "ratio": {"type": "number"},
        }
    ),
    "BudgetList": _closed(
        {
            "currency": _NULLABLE_TEXT,
            "ledger": {"type": "boolean"},
            "budgets": {"type": "array", "items": _ref("Budget")},
        }
    ),
    "Limit": {
        "type": "object",
        "required": ["org", "key", "limit", "value", "remaining", "used"],
        "properties": {
            "org": _TEXT,
            "key": _NULLABLE_TEXT,
            "limit": {"enum": ["rpm", "tpm", "max_parallel", "budget"]},
            "value": {"type": ["integer", "string"]},
            "remaining": {"type": ["integer", "string"]},
            "used": {"type": ["integer", "string"]},
            "period": {"enum": ["hour", "day", "week", "month", "total"]},
            "mode": {"enum": ["hard", "soft"]},
            "resets_at": {"type": ["number", "null"]},
        },
        "additionalProperties": False,
    },
    "LimitList": _closed(
        {
            "live": {"type": "boolean", "description": "false: prism-limits is not serving"},
            "limits": {"type": "array", "items": _ref("Limit")},
        }
    ),
}

_ACCESS = {
    "operator": "The admin token only (403 forbidden for an admin key).",
    "org": "The admin token, or an admin-scoped key for its own organisation "
    "(403 forbidden for another organisation's).",
    "open": "No credential needed.",
    "session": "The admin token or an admin key, once: answered with the console's session cookie.",
}
_ERRORS = {
    "400": "Bad input: error.param names the field",
    "401": "No usable credential (unauthenticated)",
    "403": "forbidden: error.message names the missing right; org_disabled: the "
    "caller's organisation is disabled; csrf_failed: a cookie write without X-Prism-CSRF",
    "404": "No such organisation, key or override (or the service is off)",
    "409": "conflict: exists already, revoked or disabled",
}


def _operation(route: Route) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": "OK"}
    if route.answer is not None:
        content = {"application/json": {"schema": _ref(route.answer)}}
        if route.answer == "Usage":
            content["text/csv"] = {"schema": {"type": "string"}}
        answer["content"] = content
    operation: dict[str, Any] = {
        "summary": route.summary,
        "description": _ACCESS[route.access],
        "responses": {str(route.status): answer},
    }
    params = [
        {"name": name, "in": "path", "required": True, "schema": _TEXT}
        for name in re.findall(r"{(\w+)}", route.path)
    ]
    params += [{"name": name, "in": "query", "schema": _TEXT} for name in route.query]
    if params:
        operation["parameters"] = params
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(route.body)}},
        }
    error = {"application/json": {"schema": _ref("Error")}}
    if route.access not in ("open", "session"):
        operation["security"] = [{"bearer": []}, {"session": []}]
        for status, text in _ERRORS.items():
            operation["responses"][status] = {"description": text, "content": error}
    if route.access == "session":
        for status in ("400", "401", "403"):
            operation["responses"][status] = {"description": _ERRORS[status], "content": error}
        operation["responses"]["415"] = {"description": "Not JSON", "content": error}
    return operation


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(BASE + route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Prism admin API",
            "version": "1",
            "description": "Organisations, keys, budgets, usage, breaker overrides and the "
            "audit log of a Prism gateway.",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin token ([prism] admin_token_env) or an API key "
                    "with the scope admin.",
                },
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "prism_console",
                    "description": "The console's session (POST /prism/admin/session or single "
                    "sign-on); writes also need the X-Prism-CSRF header.",
                },
            },
        },
    }
