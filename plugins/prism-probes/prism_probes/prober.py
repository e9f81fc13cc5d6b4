"""Probes: evidence about a line that customers are not (yet) sending traffic to.

Every ``interval_s`` the prober looks at the breaker's bindings and probes
those it can learn about no other way: isolated ones (a pass opens the trial
early with ``probe_opens_trial``; a failure isolates again, one backoff step
further, as a failed trial would), those in trial with no traffic, and those
``uncertain`` for lack of it.  A probe is the capability fixtures of the line
(chat; tool where the line declares ``tools``) sent through the gateway itself
as ``probe`` traffic (its internal token: no customer, no bill, no evidence),
each checked against its contract and the first-token budget.  At most
``max_concurrent`` at once, each within ``deadline_ms``, and no more than
``allowance_per_hour`` spent per clock hour (priced from the line's own
price); with prism-redis one probe per binding per interval across the fleet.

A draining gateway (or a retired generation) sends no probes, and a probe it
had in flight then is dropped, not judged: the gateway stopping (its own port
closed, its client closed) fails it, which says nothing about the upstream.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import attrs

from prism_proxy import (
    BREAKER,
    INTERNAL_HEADER,
    SHARED_STATE,
    Binding,
    BreakerView,
    Generation,
    background,
)

from .client import call_gateway
from .fixtures import Answer, Fixture, fixtures_for
from .settings import ProbeSettings

__all__ = ["Prober", "Spend"]

log = logging.getLogger("prism.probes")

#: Tokens a fixture is assumed to cost before it ran (the answer's usage replaces it).
ESTIMATE_INPUT, ESTIMATE_OUTPUT = 120, 64


@attrs.define(eq=False)
class Spend:
    """What probes spent in the current clock hour; kept across generations."""

    hour: int = -1
    spent: float = 0.0

    async def lifecycle(self) -> AsyncIterator[None]:
        yield

    def now_hour(self) -> int:
        hour = int(time.time() // 3600)
        if hour != self.hour:
            self.hour, self.spent = hour, 0.0
        return hour


def _price(binding: Binding) -> tuple[float, float, float]:
    """(input, output per million tokens, per call) from the line's ``price``; 0 when unpriced."""
    price = binding.options.get("price") or {}

    def field(name: str) -> float:
        value = price.get(name, 0) if isinstance(price, dict) else 0
        return float(value) if isinstance(value, int | float) else 0.0

    return field("input"), field("output"), field("request")


def cost(binding: Binding, input_tokens: int, output_tokens: int) -> float:
    per_in, per_out, per_call = _price(binding)
    return (input_tokens * per_in + output_tokens * per_out) / 1e6 + per_call


class Prober:
    """One generation's prober, registered as ``probes.prober``."""

    def __init__(self, settings: ProbeSettings, generation: Generation, spend: Spend) -> None:
        self.settings = settings
        self.generation = generation
        self.spend = spend
        self.paused_until: str | None = None
        self.probes = 0
        #: Each line's fixtures: fixed by the catalog and the settings, so made once.
        self._fixtures = {
            line.id: fixtures_for(line, bodies=settings.bodies)
            for line in generation.catalog.bindings.values()
        }

    async def serving(self) -> AsyncIterator[None]:
        async with background(self._loop, "prism-probes"):
            yield

    async def _loop(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                await asyncio.sleep(self.settings.interval_s)
                try:
                    await self.round(session)
                except Exception:  # a round that fails must not end probing
                    log.exception("probes: a round failed")

    def candidates(self, breaker: BreakerView) -> list[tuple[Binding, str]]:
        """(binding, why) for every binding only a probe can tell about now."""
        out = []
        for entry in breaker.health(with_text=False)["bindings"]:
            binding = self.generation.catalog.bindings.get(entry["binding"])
            if binding is None or not self.fixtures(binding):
                continue  # probe = "off"
            state, trial = entry["state"], entry.get("trial") or {}
            if state == "isolated":
                out.append((binding, "isolated"))
            elif state == "trial" and not trial.get("slots_in_use") and not trial.get("successes"):
                out.append((binding, "idle trial"))
            elif state == "eligible" and entry["assessment"] == "uncertain":
                out.append((binding, "uncertain"))
        return out

    def standing_down(self) -> bool:
        """The gateway drains or a newer generation probes: no probe goes out, none counts."""
        return self.generation.self_link.draining or self.generation.retired

    async def round(self, session: aiohttp.ClientSession) -> None:
        breaker: BreakerView | None = self.generation.services.get(BREAKER)
        url = self.generation.self_link.url
        if breaker is None or url is None or self.standing_down():
            return
        limit = asyncio.Semaphore(self.settings.max_concurrent)

        async def one(binding: Binding, why: str) -> None:
            async with limit:
                await self.probe(session, url, breaker, binding, why)

        await asyncio.gather(*(one(b, why) for b, why in self.candidates(breaker)))
        breaker.probe_status = self.status()

    def status(self) -> dict[str, Any]:
        self.spend.now_hour()
        return {
            "interval_s": self.settings.interval_s,
            "allowance_per_hour": self.settings.allowance_per_hour,
            "spent_this_hour": round(self.spend.spent, 6),
            "paused_until": self.paused_until,
            "probes": self.probes,
        }

    def _afford(self, binding: Binding) -> bool:
        hour = self.spend.now_hour()
        estimate = cost(binding, ESTIMATE_INPUT, ESTIMATE_OUTPUT) * len(self.fixtures(binding))
        if self.spend.spent + estimate <= self.settings.allowance_per_hour:
            self.paused_until = None
            return True
        until = datetime.datetime.fromtimestamp((hour + 1) * 3600, datetime.UTC)
        if self.paused_until is None:
            log.warning(
                "probes: the hourly allowance (%g) is spent; no probes until %s",
                self.settings.allowance_per_hour,
                until.isoformat(timespec="minutes"),
            )
        self.paused_until = until.isoformat(timespec="seconds").replace("+00:00", "Z")
        return False

    def fixtures(self, binding: Binding) -> list[Fixture]:
        return self._fixtures.get(binding.id, [])

    async def probe(
        self,
        session: aiohttp.ClientSession,
        url: str,
        breaker: BreakerView,
        binding: Binding,
        why: str,
    ) -> None:
        telemetry = self.generation.telemetry
        labels = {"provider": binding.provider, "upstream_model": binding.model}
        if not self._afford(binding):
            telemetry.count("prism_probes_total", 1.0, result="skipped", **labels)
            return
        if not await self._fleet_turn(binding):
            return
        headers = {INTERNAL_HEADER: self.generation.self_link.token, "x-prism-traffic": "probe"}
        problems = []
        for fixture in self.fixtures(binding):
            if self.standing_down():
                self._abandon(binding, why)
                return
            answer = await call_gateway(
                session,
                url,
                headers,
                fixture.endpoint,
                binding.id,
                fixture.body,
                stream=fixture.stream,
                timeout_s=self.settings.deadline_ms / 1000,
            )
            self.spend.spent += self._spent(binding, answer)
            if self.standing_down():
                # Failed by the gateway's own stopping, or not: either way no verdict.
                self._abandon(binding, why)
                return
            problem = answer.error or fixture.check(answer, {})
            if problem is None and answer.ttft_ms is not None:
                if answer.ttft_ms > self.settings.first_token_ms:
                    problem = (
                        f"first token {answer.ttft_ms:.0f} ms > {self.settings.first_token_ms} ms"
                    )
            if problem is not None:
                problems.append(f"{fixture.name}: {problem}")
        self.probes += 1
        passed = not problems
        detail = (
            "; ".join(problems) if problems else ", ".join(f.name for f in self.fixtures(binding))
        )
        telemetry.count("prism_probes_total", 1.0, result="pass" if passed else "fail", **labels)
        log.info(
            "probes: %s (%s) %s: %s", binding.id, why, "passed" if passed else "failed", detail
        )
        breaker.probe_result(
            binding.id,
            passed,
            detail,
            opens_trial=self.settings.probe_opens_trial and why == "isolated",
        )

    def _abandon(self, binding: Binding, why: str) -> None:
        reason = "draining" if self.generation.self_link.draining else "reloaded"
        log.info("probes: %s (%s) dropped: the gateway is %s", binding.id, why, reason)

    @staticmethod
    def _spent(binding: Binding, answer: Answer) -> float:
        usage = answer.usage or {}
        tokens_in = usage.get("prompt_tokens") or usage.get("input_tokens") or ESTIMATE_INPUT
        tokens_out = usage.get("completion_tokens") or usage.get("output_tokens") or ESTIMATE_OUTPUT
        return cost(binding, int(tokens_in), int(tokens_out))

    async def _fleet_turn(self, binding: Binding) -> bool:
        """With prism-redis: is it this gateway's turn to probe ``binding`` this interval?"""
        shared = self.generation.services.get(SHARED_STATE)
        if shared is None or not shared.healthy:
            return True  # alone, or the fleet unreachable: our own interval decides
        interval = self.settings.interval_s
        try:
            return bool(
                await shared.take_lease(
                    "probe_lease",
                    f"{shared.prefix}:probes:{binding.id}",
                    shared.me,
                    # The spacing, not the lease, makes it one per interval: the lease
                    # ends at once, the next turn opens an interval (less a margin) later.
                    limit=1,
                    lease_s=0.001,
                    spacing_s=max(0.0, interval - min(0.05, interval / 10)),
                )
            )
        except Exception:
            return True  # prism-redis marked itself degraded; probe on our own

