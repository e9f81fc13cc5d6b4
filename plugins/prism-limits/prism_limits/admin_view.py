"""The ``limits`` service: each limit of an organisation and its keys with what is left now.

The admin API's console draws a used/remaining bar from each record.  The
reading is the one ``GET /prism/me`` gives a key's holder (the limiter's
report, across the fleet when it shares counters), made for the
organisation (its own limits) and for each of its keys (the key's own), on
any model of the catalog, leaving out limits set for one model.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import attrs
from aiohttp import web

from prism_proxy import PRINCIPALS, Call, Endpoint, Generation, Principal

from .limiter import Limiter

__all__ = ["LimitsReadings"]


@attrs.frozen
class LimitsReadings:
    """:class:`prism_proxy.LimitsView` over one generation's limiter."""

    generation: Generation

    async def readings(
        self, request: web.Request, org: str, key_ids: Sequence[str]
    ) -> list[dict[str, Any]]:
        from .plugin import limiter_of  # the plugin module imports this one

        limiter = limiter_of(self.generation)
        principals = self.generation.services.get(PRINCIPALS)
        model = next(iter(self.generation.catalog.models.values()), None)
        if limiter is None or principals is None or model is None:
            return []
        owners: list[tuple[str | None, Principal | None]] = [
            (None, await principals.organisation(org))
        ]
        for each in key_ids:
            owners.append((each, await principals.key(each)))
        found: list[dict[str, Any]] = []
        for key_id, principal in owners:
            if principal is None or principal.org != org:
                continue
            scope = "organisation" if key_id is None else "key"
            for entry in await self._report(limiter, request, principal, model):
                if entry["scope"] != scope or "@" in str(entry["limit"]):
                    continue
                found.append({"org": org, "key": key_id, **_used(entry)})
        return found

    async def _report(
        self, limiter: Limiter, request: web.Request, principal: Principal, model: Any
    ) -> list[Any]:
        # A call that is never dispatched nor settled: only asked what its caller has left.
        call = Call(
            request_id=f"req_limits_{secrets.token_hex(6)}",
            endpoint=Endpoint.MODELS,
            received_at=self.generation.clock(),
            request=request,
            generation=self.generation,
        )
        call.principal, call.model, call.traffic = principal, model, "customer"
        return list(await limiter.report(call))


def _used(entry: Any) -> dict[str, Any]:
    record = {k: v for k, v in entry.items() if k != "scope"}
    value, remaining = entry["value"], entry["remaining"]
    if isinstance(value, str):  # a budget: money as decimal text
        record["used"] = str(max(Decimal(value) - Decimal(remaining), Decimal(0)))
    else:
        record["used"] = max(int(value) - int(remaining), 0)
    return record
