"""The ``overrides`` service: the breaker's operator overrides, for the admin API (prism-admin).

The same checks and records as ``/prism/breaker/overrides`` and ``prism
breaker quarantine|cap|release``; only the shape of a refusal differs (the
admin API's 400 ``invalid_request`` naming the field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from prism_proxy import Actor, Generation, PrismError

from .hooks import breaker_of
from .overrides import OverrideError, build_override, override_json
from .runtime import Breaker

__all__ = ["AdminOverrides"]


def _invalid(err: OverrideError) -> PrismError:
    return PrismError(400, "invalid_request", str(err), param=err.field)


def _typed(fields: Mapping[str, Any], name: str, kind: type, *, required: bool) -> Any:
    value = fields.get(name)
    if value is None:
        if required:
            raise OverrideError(name, "required")
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = "a whole number" if kind is int else "text"
        raise OverrideError(name, f"expected {expected}, got {value!r}")
    return value


@attrs.frozen
class AdminOverrides:
    """:class:`prism_proxy.BreakerOverrides` over the breaker of ``generation``."""

    generation: Generation

    def _breaker(self) -> Breaker:
        breaker = breaker_of(self.generation)
        if breaker is None:
            raise PrismError(404, "breaker_off", "the breaker plugin is not active")
        return breaker

    async def list_overrides(self) -> dict[str, Any]:
        breaker = self._breaker()
        wall_now = breaker.wall.now()
        active = sorted(breaker.overrides.active.values(), key=lambda o: o.created_at)
        return {
            "overrides": [override_json(o, wall_now) for o in active],
            "overdue_reviews": [o.id for o in active if o.review_overdue(wall_now)],
        }

    async def create_override(self, fields: Mapping[str, Any], actor: Actor) -> dict[str, Any]:
        breaker = self._breaker()
        try:
            override = build_override(
                kind=_typed(fields, "kind", str, required=True),
                scope=_typed(fields, "scope", str, required=True),
                target=_typed(fields, "target", str, required=True),
                reason=_typed(fields, "reason", str, required=True),
                owner=_typed(fields, "owner", str, required=True),
                created_at=breaker.wall.now(),
                review_by=_typed(fields, "review_by", str, required=False),
                review_default_s=breaker.settings.review_default_s,
                max_in_flight=_typed(fields, "max_in_flight", int, required=False),
                expires=_typed(fields, "expires", str, required=False),
            )
            await breaker.add_override(override)
        except OverrideError as err:
            raise _invalid(err) from None
        return override_json(override, breaker.wall.now())

    async def release_override(
        self, override_id: str, fields: Mapping[str, Any], actor: Actor
    ) -> dict[str, Any]:
        breaker = self._breaker()
        try:
            owner = _typed(fields, "owner", str, required=True).strip()
            reason = (_typed(fields, "reason", str, required=False) or "released").strip()
            if not owner:
                raise OverrideError("owner", "required, a non-empty string")
        except OverrideError as err:
            raise _invalid(err) from None
        ended = await breaker.release_override(override_id, owner, reason)
        if ended is None:
            raise PrismError(
                404, "override_not_found", f"no active override {override_id!r}", param="id"
            )
        return override_json(ended, breaker.wall.now())
