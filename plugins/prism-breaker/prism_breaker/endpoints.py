"""HTTP: ``GET /prism/health`` and the admin API under ``/prism/breaker/``.

Health is operational, not secret: it is open like ``/prism/stats``, so a
load balancer or a dashboard can read it without the admin token.  The
operator's words on an override (reason, owner) are shown only to a caller
presenting the admin token.  Everything that changes state, and the audit
log, needs the admin token (``prism_proxy.admin_handler``).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from prism_proxy import GATEWAY, PrismError, admin_handler, require_admin

from .hooks import breaker_of
from .overrides import OverrideError, audit_subjects, build_override, override_json
from .reports import audit_json
from .runtime import Breaker

__all__ = ["add_routes"]

MAX_AUDIT = 1000


def add_routes(app: web.Application) -> None:
    app.router.add_get("/prism/health", health)
    app.router.add_get("/prism/breaker/overrides", list_overrides)
    app.router.add_post("/prism/breaker/overrides", create_override)
    app.router.add_post("/prism/breaker/overrides/{id}/release", release_override)
    app.router.add_get("/prism/breaker/audit", audit)


def _breaker(request: web.Request) -> Breaker:
    """The breaker of the generation serving now."""
    breaker = breaker_of(request.app[GATEWAY].current)
    if breaker is None:
        raise PrismError(404, "breaker_off", "the breaker plugin is not active")
    return breaker


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    try:
        require_admin(request)
        admin = True
    except PrismError:
        admin = False
    capacity = request.app[GATEWAY].current.capacity
    return _json(_breaker(request).health(with_text=admin, capacity=capacity.report))


@admin_handler
async def list_overrides(request: web.Request) -> web.Response:
    breaker = _breaker(request)
    wall_now = breaker.wall.now()
    active = sorted(breaker.overrides.active.values(), key=lambda o: o.created_at)
    return _json(
        {
            "overrides": [override_json(o, wall_now) for o in active],
            "overdue_reviews": [o.id for o in active if o.review_overdue(wall_now)],
        }
    )


@admin_handler
async def create_override(request: web.Request) -> web.Response:
    breaker = _breaker(request)
    body = await _body(request)
    try:
        override = build_override(
            kind=_field(body, "kind", str),
            scope=_field(body, "scope", str),
            target=_field(body, "target", str),
            reason=_field(body, "reason", str),
            owner=_field(body, "owner", str),
            created_at=breaker.wall.now(),
            review_by=_optional(body, "review_by", str),
            review_default_s=breaker.settings.review_default_s,
            max_in_flight=_optional(body, "max_in_flight", int),
            expires=_optional(body, "expires", str),
        )
        await breaker.add_override(override)
    except OverrideError as err:
        raise _invalid(err) from None
    return _json({"override": override_json(override, breaker.wall.now())}, status=201)


@admin_handler
async def release_override(request: web.Request) -> web.Response:
    breaker = _breaker(request)
    body = await _body(request)
    override_id = request.match_info["id"]
    try:
        owner = _field(body, "owner", str)
        reason = _optional(body, "reason", str) or "released"
        if not owner.strip():
            raise OverrideError("owner", "required, a non-empty string")
    except OverrideError as err:
        raise _invalid(err) from None
    ended = await breaker.release_override(override_id, owner.strip(), reason.strip())
    if ended is None:
        raise PrismError(
            404, "override_not_found", f"no active override {override_id!r}", param="id"
        )
    return _json({"released": override_json(ended, breaker.wall.now())})


@admin_handler
async def audit(request: web.Request) -> web.Response:
    breaker = _breaker(request)
    await breaker.flush()  # what the caller just caused is in the answer
    raw_limit = request.query.get("limit", "100")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_AUDIT:
        raise PrismError(
            400, "invalid_limit", f"limit must be a whole number 1..{MAX_AUDIT}", param="limit"
        )
    subjects = None
    binding_id = request.query.get("binding")
    if binding_id is not None:
        binding = breaker.catalog.bindings.get(binding_id)
        if binding is None:
            raise PrismError(
                404,
                "binding_not_found",
                f"no binding {binding_id!r} in the catalog",
                param="binding",
            )
        subjects = audit_subjects(binding)
    entries = await breaker.store.audit(subjects=subjects, limit=int(raw_limit))
    return _json({"entries": [audit_json(e) for e in entries]})


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise PrismError(400, "invalid_json", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise PrismError(400, "invalid_json", "the request body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    if name not in body:
        raise OverrideError(name, "required")
    return _typed(body, name, kind)


def _optional(body: dict[str, Any], name: str, kind: type) -> Any:
    if body.get(name) is None:
        return None
    return _typed(body, name, kind)


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = "a whole number" if kind is int else "a string"
        raise OverrideError(name, f"expected {expected}, got {value!r}")
    return value


def _invalid(err: OverrideError) -> PrismError:
    return PrismError(400, "invalid_override", str(err), param=err.field)
