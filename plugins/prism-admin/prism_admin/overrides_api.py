"""``/prism/admin/overrides``: the breaker's operator overrides, for the operator only.

The breaker (prism-breaker) provides them as the ``overrides`` service; this
plugin never imports it.  Each write is also an entry in the key database's
audit log (``override.quarantine``, ``override.cap``, ``override.release``),
with the actor that made it, after the breaker recorded it in its own.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy import GATEWAY, OVERRIDES, BreakerOverrides, PrismError

from .access import Credential, keys_or_none
from .body import json_body

__all__ = ["CREATE_FIELDS", "create_override", "list_overrides", "release_override"]

RIGHT = "breaker overrides"
CREATE_FIELDS = (
    "kind",
    "scope",
    "target",
    "reason",
    "owner",
    "review_by",
    "max_in_flight",
    "expires",
)


def _overrides(request: web.Request, who: Credential) -> BreakerOverrides:
    who.require_operator(RIGHT)
    found: BreakerOverrides | None = request.app[GATEWAY].current.services.get(OVERRIDES)
    if found is None:
        raise PrismError(
            404, "breaker_off", "no plugin provides breaker overrides: install prism-breaker"
        )
    return found


async def _audit(
    request: web.Request,
    who: Credential,
    action: str,
    record: dict[str, Any],
    *,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    keys = keys_or_none(request)
    if keys is not None:
        await keys.record(who.actor, action, f"override:{record['id']}", before=before, after=after)


async def list_overrides(request: web.Request, who: Credential) -> web.StreamResponse:
    return web.json_response(await _overrides(request, who).list_overrides())


async def create_override(request: web.Request, who: Credential) -> web.StreamResponse:
    service = _overrides(request, who)
    body = await json_body(request, CREATE_FIELDS, ("kind", "scope", "target", "reason"))
    # The owner defaults to who makes it: the person (or token) answerable for the review.
    body.setdefault("owner", who.actor.name)
    record = await service.create_override(body, who.actor)
    await _audit(request, who, f"override.{record['kind']}", record, before=None, after=record)
    return web.json_response(record, status=201)


async def release_override(request: web.Request, who: Credential) -> web.StreamResponse:
    service = _overrides(request, who)
    body = await json_body(request, ("owner", "reason"))
    body.setdefault("owner", who.actor.name)
    record = await service.release_override(request.match_info["id"], body, who.actor)
    await _audit(request, who, "override.release", record, before=record, after=None)
    return web.json_response(record)
