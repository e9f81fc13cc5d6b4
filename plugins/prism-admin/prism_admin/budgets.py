"""``GET /prism/admin/budgets``: each budget of an organisation and its keys, used and remaining.

The budgets are the ``budget`` and ``budget@MODEL`` settings on the
organisation's record and on its keys' (the ``key-admin`` service); what
is used is the ledger's cost since the budget's calendar period began (UTC
hour, day, week from Monday, month, or ever for ``total``), from the
``usage`` service: the same truth prism-limits rebuilds its budget counters
from.  Spend the limiter has reserved for calls still in flight is not in
the ledger yet, so ``used`` may trail the limiter's own count by those.
"""

from __future__ import annotations

import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from aiohttp import web

from prism_proxy import (
    GATEWAY,
    LIMITS,
    USAGE,
    LimitsView,
    PrismError,
    UsageQuery,
    UsageReport,
)

from .access import Credential, keys_or_none, wall_now
from .body import reject_unknown

__all__ = ["budget_rows", "budgets", "limits", "period_start"]

PERIODS = ("hour", "day", "week", "month", "total")


def period_start(period: str, now: float) -> datetime.datetime | None:
    """Where the calendar period containing ``now`` began (UTC); None for ``total``."""
    at = datetime.datetime.fromtimestamp(now, datetime.UTC)
    if period == "hour":
        return at.replace(minute=0, second=0, microsecond=0)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - datetime.timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return None


def _parse(text: str) -> tuple[Decimal, str] | None:
    amount, _, period = text.partition("/")
    try:
        value = Decimal(amount.strip())
    except InvalidOperation:
        return None
    period = period.strip()
    return (value, period) if period in PERIODS and value.is_finite() else None


def budget_rows(settings: dict[str, Any]) -> list[tuple[str | None, str, Decimal, str]]:
    """(model or None, the setting's text, amount, period) of each budget in ``settings``."""
    rows = []
    for name, text in sorted(settings.items()):
        base, _, model = name.partition("@")
        if base != "budget" or not isinstance(text, str):
            continue
        parsed = _parse(text)
        if parsed is not None:
            rows.append((model or None, text, *parsed))
    return rows


async def _org_record(request: web.Request, who: Credential) -> tuple[str, dict[str, Any]]:
    reject_unknown(request.query, ("org",))
    org = request.query.get("org", who.org)
    if org is None:
        raise PrismError(400, "invalid_request", "org: required", param="org")
    who.require_org(org)
    keys = keys_or_none(request)
    if keys is None:
        raise PrismError(
            404, "keys_off", "no plugin administers keys: install and configure prism-keys"
        )
    record = await keys.get_org(org)
    if record is None:
        raise PrismError(404, "not_found", f"no organisation {org!r}")
    return org, record


async def limits(request: web.Request, who: Credential) -> web.StreamResponse:
    """``GET /prism/admin/limits``: what each limit of the organisation and its keys has
    left now, as the limiter counts it (the ``limits`` service, prism-limits)."""
    org, _ = await _org_record(request, who)
    view: LimitsView | None = request.app[GATEWAY].current.services.get(LIMITS)
    if view is None:
        return web.json_response({"live": False, "limits": []})
    keys = keys_or_none(request)
    assert keys is not None
    live = [k["id"] for k in await keys.list_keys(org) if not k.get("revoked")]
    return web.json_response({"live": True, "limits": await view.readings(request, org, live)})


async def budgets(request: web.Request, who: Credential) -> web.StreamResponse:
    org, record = await _org_record(request, who)
    keys = keys_or_none(request)
    assert keys is not None
    report: UsageReport | None = request.app[GATEWAY].current.services.get(USAGE)
    now = wall_now(request)
    owners: list[tuple[str | None, dict[str, Any]]] = [(None, record.get("settings") or {})]
    for key in await keys.list_keys(org):
        if not key.get("revoked"):
            owners.append((key["id"], key.get("settings") or {}))
    out = []
    for key_id, settings in owners:
        for model, text, amount, period in budget_rows(settings):
            start = period_start(period, now)
            used = Decimal(0)
            if report is not None:
                used = await _spent(report, org, key_id, model, period, start)
            out.append(
                {
                    "org": org,
                    "key": key_id,
                    "model": model,
                    "budget": text,
                    "amount": str(amount),
                    "period": period,
                    "since": start.isoformat().replace("+00:00", "Z") if start else None,
                    "used": str(used),
                    "remaining": str(max(amount - used, Decimal(0))),
                    "ratio": float(used / amount) if amount > 0 else 1.0,
                }
            )
    return web.json_response(
        {
            "currency": report.currency if report is not None else None,
            "ledger": report is not None,
            "budgets": out,
        }
    )


async def _spent(
    report: UsageReport,
    org: str,
    key_id: str | None,
    model: str | None,
    period: str,
    start: datetime.datetime | None,
) -> Decimal:
    # The usage service counts whole UTC days; an hour's budget takes its hour's row.
    hourly = period == "hour"
    query = UsageQuery(
        since=start.date().isoformat() if start else None,
        group_by=("hour",) if hourly else ("org",),
        org=org,
        key_id=key_id,
        model=model,
    )
    groups, total = await report.usage(query)
    if not hourly:
        return Decimal(total["cost"])
    assert start is not None
    hour = start.strftime("%Y-%m-%dT%H")
    return sum((Decimal(g["cost"]) for g in groups if g.get("hour") == hour), Decimal(0))
