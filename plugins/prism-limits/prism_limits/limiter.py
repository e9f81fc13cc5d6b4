"""One generation's limiter: admits calls against their limits, settles what they used.

Admission (``prism_admit_call``) works out every limit that applies to the
call and what the call asks of each (a request; its prompt estimate plus its
output cap in tokens; a slot; its worst-case cost on the dearest line of its
route), then asks the engine once: the fleet's counters in Redis when
prism-redis provides shared state, else this process's own.  Settlement
(``prism_settle``) gives back the reservations and counts what the serving
attempt really used, priced by billing (the ``pricing`` service).  A budget
counter the engine does not hold is rebuilt from the ledger (the ``spend``
service) before it is used.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from prism_proxy import (
    Binding,
    Call,
    Pricing,
    PrismError,
    Settlement,
    SharedState,
    SpendLedger,
    Telemetry,
    Usage,
    output_cap,
    prompt_tokens,
)

from .alerts import BudgetAlerts, Outbox
from .counting import RECENT_S, Ask, Decision, Held, LocalCounters
from .fleet import FleetCounters
from .limits import Kind, Limit, Period, applying, format_money
from .periods import Window, window
from .plan import Plan
from .settings import LimitsSettings

__all__ = ["HELD", "Limiter"]

#: How many callers' limits (and calls' worst cases) are remembered before starting afresh.
_PLANS = 4096
_BUDGET = Kind.BUDGET
#: Rebuilds of a call's missing budget counters before it is refused (each rebuilt
#: counter may be dropped again by a rebase before the call is admitted).
_REBUILDS = 3

log = logging.getLogger("prism.limits")

#: ``call.extensions`` key of what a call holds until it settles.
HELD = "limits"


class Limiter:
    """Limits for one generation; the counters outlive it (kept by the plugin)."""

    def __init__(
        self,
        settings: LimitsSettings,
        local: LocalCounters,
        *,
        fleet: FleetCounters | None = None,
        link: SharedState | None = None,
        pricing: Pricing | None = None,
        spend: SpendLedger | None = None,
        telemetry: Telemetry | None = None,
        outbox: Outbox | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.defaults = settings.defaults()
        self.local = local
        self.fleet = fleet
        self.link = link
        self.pricing = pricing
        self.spend = spend
        self.telemetry = telemetry or Telemetry()
        self.wall = wall
        #: Gateways the fleet engine saw lately: the share of a limit while it is away.
        self.gateways = 1
        self._plans: dict[tuple[int, str], Plan] = {}
        self._windows: dict[Period, Window] = {}
        self._worst: dict[tuple[Any, ...], int] = {}
        # Without a kept outbox handed over, this generation's own: it sends while it has
        # something to send and stops by itself.
        self.alerts = BudgetAlerts(
            settings.alert_thresholds,
            settings.alert_url,
            outbox if outbox is not None else Outbox(),
            self.telemetry,
            currency=pricing.currency if pricing is not None else None,
            wall=wall,
        )

    # -- admission -----------------------------------------------------------

    def limits_of(self, call: Call) -> Sequence[Limit]:
        plan = self.plan_of(call)
        return () if plan is None else plan.limits

    def plan_of(self, call: Call) -> Plan | None:
        """The call's limits and what about them stays the same from call to call."""
        model = call.model
        if model is None or call.traffic != "customer":
            return None
        principal = call.principal
        # Worked out once per caller and model: the principal object is the auth
        # plugin's, the same for every call until its settings change.
        key = (id(principal), model.name)
        plan = self._plans.get(key)
        if plan is None or plan.principal is not principal:
            if len(self._plans) >= _PLANS:
                self._plans.clear()
            limits = applying(
                principal.org,
                principal.key_id,
                principal.settings,
                principal.key_settings,
                self.defaults,
                model.name,
            )
            plan = self._plans[key] = Plan.of(principal, limits)
        return plan if plan.limits else None

    def admit(self, call: Call) -> Awaitable[None] | None:
        plan = self.plan_of(call)
        if plan is None:
            return None
        now = self.wall()
        asks = self._asks(call, plan, now)
        if self.fleet is None:
            # Counted in the process: decided here, with no awaitable to build and await,
            # unless a budget counter must first be rebuilt from the ledger.
            decision = self.local.admit(asks, call.request_id, now)
            if not decision.missing:
                self._conclude(call, asks, decision, int(now), self.local, plan)
                return None
        return self._admit(call, asks, plan)

    def window(self, period: Period, now: float | None = None) -> Window:
        """The current period of kind ``period`` (worked out again only when it ends)."""
        if now is None:
            now = self.wall()
        span = self._windows.get(period)
        if span is None or now < span.start or (span.end is not None and now >= span.end):
            span = self._windows[period] = window(period, now)
        return span

    def _asks(self, call: Call, plan: Plan, now: float) -> list[Ask]:
        # The asks of rpm and max_parallel are the plan's own (their amount is always 1).
        asks = list(plan.fixed)
        varying = plan.varying
        if not varying:
            return asks
        tokens = self._tokens(call) if plan.tpm else 0
        worst = self.worst_case(call, self._route(call)) if plan.budget else 0
        counters = plan.counters
        for index, limit in varying:
            period = limit.period
            if period is None:
                asks[index] = Ask(limit, limit.counter, tokens)
                continue
            named = counters.get(index)
            if named is not None:
                span = named[0]
                end = span.end
                # Still the period it was named in (the plan's own: no lookup needed).
                if span.start <= now and (end is None or now < end):
                    asks[index] = Ask(limit, named[1], worst, end)
                    continue
            span = self.window(period, now)
            counters[index] = (span, f"{limit.counter}:{span.name}")
            asks[index] = Ask(limit, counters[index][1], worst, span.end)
        return asks

    @staticmethod
    def _route(call: Call) -> Sequence[Binding]:
        route = call.route
        return route.bindings if route is not None else ()

    def _tokens(self, call: Call) -> int:
        """The prompt estimate plus the output cap the request or its first line sets
        (none set: the prompt alone; the real count corrects it at settlement)."""
        prompt = prompt_tokens(call)
        bindings = self._route(call)
        if not bindings:
            return prompt
        cap = output_cap(call.endpoint, call.body, bindings[0])
        return prompt + (0 if cap >= 1_000_000 else cap)

    def worst_case(self, call: Call, bindings: Sequence[Binding]) -> int:
        """The most the call can cost on the dearest of ``bindings`` (nano-units)."""
        pricing = self.pricing
        if pricing is None:
            return 0
        prompt = prompt_tokens(call)
        body = call.body
        # Calls alike (same lines, prompt size and caps) cost alike: priced once.
        key = (
            tuple(bindings),
            call.endpoint,
            prompt,
            body.get("max_tokens"),
            body.get("max_completion_tokens"),
            body.get("n"),
        )
        worst = self._worst.get(key)
        if worst is None:
            worst = 0
            for binding in bindings:
                usage = Usage(
                    input_tokens=prompt,
                    output_tokens=output_cap(call.endpoint, body, binding),
                )
                worst = max(worst, pricing.cost(binding, usage))
            if len(self._worst) >= _PLANS:
                self._worst.clear()
            self._worst[key] = worst
        return worst

    async def _admit(self, call: Call, asks: list[Ask], plan: Plan) -> None:
        member = call.request_id
        fleet = self.fleet
        engine: object = self.local
        decision: Decision | None = None
        second = int(self.wall())
        if fleet is not None and self._shared():
            try:
                decision, second = await self._fleet_admit(fleet, asks, member)
                engine = fleet
            except PrismError:
                raise
            except Exception as exc:  # an engine that does not answer: its guard said so
                log.debug("limits: shared state did not answer (%s)", type(exc).__name__)
                decision = None
        if decision is None:
            if fleet is not None:
                if self.settings.on_shared_state_loss == "open":
                    return
                if self.settings.on_shared_state_loss == "closed":
                    call.response_headers["Retry-After"] = "5"
                    raise PrismError(
                        503,
                        "limits_unavailable",
                        "Prism cannot count this call against its limits right now (its "
                        "shared state does not answer), so it refused it before calling any "
                        "provider; retry shortly",
                        type="api_error",
                    )
                asks = [_shared_out(ask, self.gateways) for ask in asks]
            decision = await self._local_admit(asks, member)
        elif engine is fleet:
            self.gateways = max(decision.gateways, 1)
        self._conclude(call, asks, decision, second, engine, plan)

    def _conclude(
        self,
        call: Call,
        asks: list[Ask],
        decision: Decision,
        second: int,
        engine: object,
        plan: Plan,
    ) -> None:
        """Tell the caller (headers, or the refusal) and keep what the call holds."""
        plan.headers(call.response_headers, asks, decision.readings)
        if decision.refused is not None:
            self._refuse(call, asks[decision.refused], decision)
        held = Held(asks, call.request_id, second, engine, plan.budgets, plan.counters)
        call.extensions[HELD] = held
        fleet = self.fleet
        if fleet is not None and engine is fleet:
            fleet.held[held.member] = held

    def _shared(self) -> bool:
        fleet = self.fleet
        # The fleet remembers a False answer, so that it rebases when Redis answers again.
        return fleet.usable() if fleet is not None else False

    async def _fleet_admit(
        self, fleet: FleetCounters, asks: list[Ask], member: str
    ) -> tuple[Decision, int]:
        decision, second = await fleet.admit(asks, member)
        for _ in range(_REBUILDS):
            if not decision.missing:
                return decision, second
            for ask in asks:
                if ask.counter in decision.missing:
                    spent, counted = await self.ledger_read(ask)
                    await fleet.rebuilt(ask.counter, spent, counted, ask.reset_at)
            # A rebase may have dropped it again meanwhile: then once more.
            decision, second = await fleet.admit(asks, member)
        return _unrebuilt(decision), second

    async def _local_admit(self, asks: list[Ask], member: str) -> Decision:
        decision = self.local.admit(asks, member, self.wall())
        for _ in range(_REBUILDS):
            if not decision.missing:
                return decision
            for ask in asks:
                if ask.counter in decision.missing:
                    spent, counted = await self.ledger_read(ask)
                    self.local.rebuilt(ask.counter, spent, counted, self.wall())
            decision = self.local.admit(asks, member, self.wall())
        return _unrebuilt(decision)

    async def ledger_spend(self, ask: Ask) -> int:
        """What the ledger says ``ask``'s owner spent in the budget's current period."""
        spent, _ = await self.ledger_read(ask)
        return spent

    async def ledger_read(self, ask: Ask) -> tuple[int, frozenset[str]]:
        """What the ledger says ``ask``'s owner spent in the budget's current period,
        and which of the calls settled lately that total counts (one snapshot)."""
        spend = self.spend
        if spend is None:
            return 0, frozenset()
        limit = ask.limit
        assert limit.period is not None
        now = self.wall()
        # Twice the engines' memory: the ledger's clock and Redis's may differ a little.
        recent_since = datetime.datetime.fromtimestamp(now - 2 * RECENT_S, datetime.UTC)
        snapshot = await spend.spend_snapshot(window(limit.period, now).since(), recent_since)
        owner = limit.owner
        total = 0
        counted: set[str] = set()
        for (org, key_id, model), spent in snapshot.totals.items():
            if limit.model is not None and model != limit.model:
                continue
            if owner.scope == "organisation" and org != owner.name:
                continue
            if owner.scope == "key" and key_id != owner.name:
                continue
            if owner.scope == "default" and (
                org is not None or (key_id or "anonymous") != owner.name
            ):
                continue
            total += spent.nanos
            counted |= snapshot.recent.get((org, key_id, model), frozenset())
        return total, frozenset(counted)

    def _refuse(self, call: Call, ask: Ask, decision: Decision) -> None:
        limit = ask.limit
        assert decision.refused is not None
        reading = decision.readings[decision.refused]
        self.telemetry.count(
            "prism_limit_refusals_total", limit=limit.metric, scope=limit.owner.scope
        )
        headers = call.response_headers
        if limit.kind is Kind.BUDGET:
            wait = reading[1]
            if math.isfinite(wait):
                headers["Retry-After"] = str(max(1, math.ceil(wait)))
            # Waiting a few seconds cannot help: the SDKs must not retry on their own.
            headers["x-should-retry"] = "false"
            resets = (
                "never (a total budget)"
                if not math.isfinite(wait)
                else f"in {max(1, math.ceil(wait))} s"
            )
            raise PrismError(
                429,
                "budget_exceeded",
                f"budget exceeded: {limit.describe()} (this call could cost up to "
                f"{format_money(ask.amount)} with its output cap; "
                f"{format_money(reading[0])} remains; the period resets {resets}; "
                "a smaller max_tokens reserves less)",
                type="insufficient_quota",
            )
        wait = reading[1] if limit.kind is Kind.WINDOW else 1.0
        headers["Retry-After"] = str(max(1, math.ceil(wait)))
        raise PrismError(
            429, "rate_limited", f"rate limited: {limit.describe()}", type="rate_limit_error"
        )

    # -- attempts and settlement ---------------------------------------------

    def veto(self, call: Call, binding: Binding) -> str | None:
        """A line dearer than the call's reservation (a fallback off its route) is not tried."""
        held = call.extensions.get(HELD)
        if held is None:
            return None
        route = call.route
        if route is not None and binding in route.bindings:
            return None  # its worst case is in the reservation already
        reserved = [ask.amount for ask in held.asks if ask.limit.kind is _BUDGET]
        if not reserved or self.pricing is None:
            return None
        if self.worst_case(call, (binding,)) > min(reserved):
            return "limits: could cost more than the call's budget reservation"
        return None

    def settle(self, call: Call, settlement: Settlement) -> None:
        held: Held | None = call.extensions.pop(HELD, None)
        if held is None:
            return
        served = settlement.served
        usage = settlement.usage
        tokens = cost = 0
        if served is not None:
            if usage is not None:
                tokens = usage.input_tokens + usage.output_tokens
            if self.pricing is not None:
                cost = self.pricing.cost(served.binding, usage)
        # Each budget's counter in the period the call settled in (what its cost goes to).
        budgets: list[tuple[Limit, Window, str]] = []
        spend_counters: list[str] = []
        if held.budgets:
            now = self.wall()
            asks = held.asks
            for index in held.budgets:
                ask = asks[index]
                limit = ask.limit
                named = held.periods.get(index)
                span: Window
                if named is not None and named[1] is ask.counter:
                    span = named[0]
                    end = span.end
                    if not (span.start <= now and (end is None or now < end)):
                        assert limit.period is not None
                        span = self.window(limit.period, now)
                else:
                    assert limit.period is not None
                    span = self.window(limit.period, now)
                # Mostly the period it was admitted in, whose counter it names already.
                counter = (
                    ask.counter if span.end == ask.reset_at else f"{limit.counter}:{span.name}"
                )
                budgets.append((limit, span, counter))
                spend_counters.append(counter)
        principal = call.principal
        # Counted once billing's ledger holds the call's row: a gateway killed in between
        # counts nothing the ledger will not have (the counters are rebuilt from it).
        call.when_settled(
            lambda recorded: self._settled(
                held,
                tokens,
                cost if recorded else 0,
                budgets,
                spend_counters,
                principal.org,
                principal.key_id,
            )
        )

    def _settled(
        self,
        held: Held,
        tokens: int,
        cost: int,
        budgets: list[tuple[Limit, Window, str]],
        spend_counters: list[str],
        org: str | None,
        key_id: str | None,
    ) -> None:
        fleet = self.fleet
        if fleet is not None and held.engine is fleet:
            fleet.held.pop(held.member, None)
            done: Callable[[list[int]], None] | None = None
            if budgets:
                alerts = self.alerts

                def done(spent: list[int]) -> None:
                    # Redis added this cost alone (HINCRBY): only this gateway sees these
                    # crossings.
                    alerts.settled(org, key_id, budgets, spent, cost)

            # Written in the background with this turn's other settlements: never a delay
            # for the caller.  One that fails: its reservations run out with their leases,
            # the ledger has its cost, and the counters are rebuilt from it.
            fleet.settle_soon(held, tokens, cost, spend_counters, done)
        else:
            spent = self.local.settle(held, tokens, cost, spend_counters, self.wall())
            if budgets:
                self.alerts.settled(org, key_id, budgets, spent, cost)

    # -- what a caller may know ----------------------------------------------

    async def report(self, call: Call) -> list[Mapping[str, Any]]:
        """The limits that apply to ``call``'s caller on its model, with what remains."""
        plan = self.plan_of(call)
        if plan is None:
            return []
        now = self.wall()
        asks = self._asks(call, plan, now)
        readings = self.local.readings(asks, now)
        if self.fleet is not None and self._shared():
            readings = await self.fleet.readings(asks)
        found: list[Mapping[str, Any]] = []
        for ask, used in zip(asks, readings, strict=True):
            limit = ask.limit
            entry: dict[str, Any] = {"scope": limit.owner.scope, "limit": limit.setting}
            if limit.kind is Kind.BUDGET:
                assert limit.period is not None
                entry["value"] = format_money(limit.value)
                entry["period"] = limit.period.value
                entry["mode"] = "soft" if limit.soft else "hard"
                spent = await self.ledger_spend(ask) if used is None else used
                entry["remaining"] = format_money(max(limit.value - spent, 0))
                entry["resets_at"] = ask.reset_at
            else:
                entry["value"] = limit.value
                entry["remaining"] = max(limit.value - (used or 0), 0)
            found.append(entry)
        return found


def _unrebuilt(decision: Decision) -> Decision:
    """A decision still missing a budget counter after every rebuild (rebases racing
    them): the call cannot be counted, so it is not admitted."""
    if not decision.missing:
        return decision
    raise PrismError(
        503,
        "limits_unavailable",
        "Prism could not count this call against its budget (its counter was being "
        "rebuilt from the ledger); retry shortly",
        type="api_error",
    )


def _shared_out(ask: Ask, gateways: int) -> Ask:
    """This gateway's share of a limit while the fleet's counters are away."""
    if gateways <= 1:
        return ask
    return Ask(ask.limit, ask.counter, ask.amount, ask.reset_at, ask.limit.value // gateways)
