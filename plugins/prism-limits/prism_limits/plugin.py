"""The prism_proxy entry point ``limits``: rate limits and budgets per key and organisation.

The limits are organisation and key settings (``prism keys org-set ORG
rpm=600 budget=250/month``, ``prism keys set KEY_ID tpm=20000``) and
``[prism:limits]`` for callers without an organisation.  With prism-redis
(the ``shared-state`` service) every gateway counts in the same counters;
without it each process counts its own, which is why ``--workers N`` is
refused then.  Prices and the ledger come from prism-billing (the
``pricing`` and ``spend`` services); without billing, budgets count nothing.
``prism limits show|rebase`` and the ``prism check`` lines are in :mod:`.cli`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from aiohttp import web

from prism_proxy import (
    GATEWAY,
    LIMITS,
    PRICING,
    SHARED_STATE,
    SPEND,
    TELEMETRY,
    Binding,
    Call,
    CheckLine,
    Commands,
    Config,
    Generation,
    Offer,
    OrgSetting,
    PrismError,
    Settlement,
    authenticated_call,
    error_response,
    hookimpl,
    provide,
)

from .admin_view import LimitsReadings
from .alerts import Outbox
from .counting import LocalCounters
from .fleet import FleetCounters
from .limiter import Limiter
from .limits import declarations
from .settings import SECTION, LimitsSettings

__all__ = ["LIMITER", "ME_PATH", "LimitsHooks", "limiter_of"]

#: The name each generation's hooks are registered under.
LIMITER = "limits.limiter"
#: Where a key holder reads its own limits.
ME_PATH = "/prism/me"


class LimitsHooks:
    """The per-call hooks of one generation's limiter."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    @hookimpl
    def prism_admit_call(self, call: Call) -> Awaitable[None] | None:
        return self.limiter.admit(call)

    @hookimpl
    def prism_admit_attempt(self, call: Call, binding: Binding) -> str | None:
        return self.limiter.veto(call, binding)

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> None:
        self.limiter.settle(call, settlement)

    @hookimpl
    def prism_readyz(self, generation: Generation) -> Mapping[str, object]:
        limiter = self.limiter
        fleet = limiter.fleet
        if fleet is None:
            return {"limits": {"state": "ok", "counted": "per process"}}
        healthy = fleet.usable()
        mode = limiter.settings.on_shared_state_loss
        return {
            "limits": {
                # Degraded: limits are kept by each gateway alone (share), not at all
                # (open), or limited calls are refused (closed) until shared state answers.
                "state": "ok" if healthy else "degraded",
                "counted": "fleet" if healthy else f"locally ({mode})",
                "on_shared_state_loss": mode,
                "gateways": limiter.gateways,
                # Rebases after shared state answered again (budgets rebuilt from the ledger).
                "rebased_after_outages": fleet.returns,
            }
        }


def limiter_of(generation: Generation) -> Limiter | None:
    hooks = generation.plugin(LIMITER)
    return hooks.limiter if isinstance(hooks, LimitsHooks) else None


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = LimitsSettings.from_config(generation.config)
    services = generation.services
    link = services.get(SHARED_STATE)
    lease_s = settings.lease_s
    # Kept across reloads: calls in flight on the old generation settle on the same counters.
    local = generation.keep(("limits.local",), LocalCounters)
    fleet: FleetCounters | None = None
    if link is not None:
        # Keyed by the link itself: a reload onto another Redis gets counters of its own.
        fleet = generation.keep(("limits.fleet", link), lambda: FleetCounters(link, lease_s, local))
        fleet.lease_s = lease_s  # a reload may change it
    limiter = Limiter(
        settings,
        local,
        fleet=fleet,
        link=link,
        pricing=services.get(PRICING),
        spend=services.get(SPEND),
        telemetry=services.get(TELEMETRY),
        # Kept: alerts still being sent outlive a reload (and get a grace at shutdown).
        outbox=generation.keep(("limits.alerts",), Outbox),
    )
    hooks = LimitsHooks(limiter)
    generation.register(hooks, LIMITER)


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]]:
    # What each limit has left, for the admin API's console (prism-admin).
    return [provide(LIMITS, lambda: LimitsReadings(generation))]


@hookimpl
def prism_org_settings() -> list[OrgSetting]:
    return declarations()


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: LimitsSettings}


@hookimpl
def prism_workers(generation: Generation, count: int) -> str | None:
    limiter = limiter_of(generation)
    if limiter is None or limiter.fleet is not None:
        return None
    return (
        f"prism-limits counts each limit in one process; {count} workers would each count "
        f"their own and let {count} times every limit through. Run one worker, share the "
        "counters through Redis (install prism-redis and set [prism:redis] url), or disable "
        "limits ([prism] disable = limits)"
    )


@hookimpl
def prism_cli(commands: Commands) -> None:
    # Imported when asked for: the command line's module imports this one (limiter_of).
    from .cli import add_commands

    add_commands(commands)


@hookimpl
def prism_check(generation: Generation, offline: bool) -> list[CheckLine]:
    from .cli import check_lines

    return check_lines(generation)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app.router.add_get(ME_PATH, me_handler)


async def me_handler(request: web.Request) -> web.StreamResponse:
    """``GET /prism/me[?model=NAME]``: the caller's own limits, what remains, when each resets."""
    try:
        call = authenticated_call(request)
        generation = request.app[GATEWAY].current
        limiter = limiter_of(generation)
        principal = call.principal
        body: dict[str, Any] = {
            "key_id": principal.key_id,
            "organisation": principal.org,
        }
        model_name = request.query.get("model")
        if model_name is not None:
            call.model = generation.catalog.resolve(model_name)
            if call.model is None:
                raise PrismError(
                    404, "model_not_found", "model is not in the catalog", param="model"
                )
        if limiter is not None:
            if call.model is None:
                # Limits of the caller as a whole: those not set for one model.
                call.model = _any_model(generation)
            call.traffic = "customer"
            limits = await limiter.report(call) if call.model is not None else []
            body["limits"] = [
                entry
                for entry in limits
                if model_name is not None or "@" not in str(entry["limit"])
            ]
        return web.json_response(body)
    except PrismError as err:
        return error_response(err, request=request)


def _any_model(generation: Generation) -> Any:
    for model in generation.catalog.models.values():
        return model
    return None
