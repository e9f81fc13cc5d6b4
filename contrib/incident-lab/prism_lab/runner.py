"""Runs one variant of a scenario: the real processes, the weather, the traffic, the samples."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from .gatewayconf import write_gateway_config
from .procs import LabError, Processes, free_port
from .scenario import Scenario, Variant
from .traffic import Call, drive_traffic, organisations

__all__ = ["Sample", "VariantRun", "run_variant"]


@attrs.define
class Sample:
    """What the gateway and the fake said at one moment (scenario seconds)."""

    t: float
    #: binding → {"state", "in_flight", "ramp", "error_rate"}: the first replica's /prism/health.
    bindings: dict[str, dict[str, Any]]
    #: The capacity rule's ``/prism/capacity`` (prism-metrics loaded), else None.
    capacity: dict[str, Any] | None = None


@attrs.define
class LedgerRow:
    model: str
    binding: str
    input_tokens: int
    output_tokens: int
    cost: float
    #: The caller's organisation (None: the run had no keys).
    org: str | None = None


@attrs.define
class VariantRun:
    variant: Variant
    calls: list[Call]
    samples: list[Sample]
    ledger: list[LedgerRow]
    #: Upstream requests that reached a provider while it was sick.
    sick_calls: int


def condition_at(scenario: Scenario, provider: str, t: float, seed: int) -> dict[str, Any]:
    """The fake's standing condition for ``provider`` at scenario time ``t`` (real units)."""
    spec = scenario.providers[provider]
    scale = scenario.time_scale
    multiplier = 1.0
    errors: dict[str, float] = {}
    refuse = empty = cut = 0.0
    retry_after: float | None = None
    for fault in scenario.faults:
        if fault.provider != provider or not fault.active(t):
            continue
        multiplier = max(multiplier, fault.multiplier(t))
        for status, share in fault.errors.items():
            errors[str(status)] = errors.get(str(status), 0.0) + share
        if fault.rate_limited:
            errors["429"] = errors.get("429", 0.0) + fault.rate_limited
            retry_after = fault.retry_after_s * scale
        refuse += fault.refused
        empty += fault.empty
        cut += fault.cut
    limit = {} if spec.concurrency is None else {"max_concurrency": spec.concurrency}
    return {
        **limit,
        "first_token_delay_s": round(spec.first_token_ms * multiplier * scale / 1000, 6),
        "token_delay_s": round(spec.token_ms * scale / 1000, 6),
        "errors": errors,
        "retry_after_s": retry_after,
        "refuse": refuse,
        "empty": empty,
        "cut": cut,
        "seed": seed,
    }


@attrs.define
class Weather:
    """Keeps each provider's condition at the fake in step with the timeline."""

    scenario: Scenario
    fake: str
    session: aiohttp.ClientSession
    #: Upstream requests a provider answered while a fault of the timeline stood.
    sick_calls: int = 0
    _last: dict[str, dict[str, Any]] = attrs.field(factory=dict, alias="_last")
    _sick: dict[str, bool] = attrs.field(factory=dict, alias="_sick")
    _changes: int = attrs.field(default=0, alias="_changes")

    def _count(self, provider: str, answer: Mapping[str, Any]) -> None:
        if self._sick.get(provider):
            self.sick_calls += int(answer["replaced_draws"])

    async def step(self, t: float) -> None:
        for i, provider in enumerate(self.scenario.providers):
            wanted = condition_at(self.scenario, provider, t, seed=0)
            if wanted == self._last.get(provider):
                continue
            self._last[provider] = wanted
            # The seed moves with each change so the draws do not restart on every update.
            self._changes += 1
            body = {**wanted, "seed": self.scenario.seed * 1_000_003 + i * 10_007 + self._changes}
            async with self.session.put(f"{self.fake}/_fake/condition/{provider}", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"the fake refused a condition: {await r.text()}")
                self._count(provider, await r.json())
            self._sick[provider] = self.scenario.sick(provider, t)

    async def follow(self, now: Callable[[], float]) -> None:
        """Steps with the clock until cancelled."""
        while True:
            await self.step(now())
            await asyncio.sleep(max(0.02, 0.25 * self.scenario.time_scale))

    async def finish(self) -> None:
        for provider in self.scenario.providers:
            async with self.session.delete(f"{self.fake}/_fake/condition/{provider}") as r:
                self._count(provider, await r.json())
            self._sick[provider] = False


async def _sample(
    scenario: Scenario,
    gateway: str,
    session: aiohttp.ClientSession,
    now: Callable[[], float],
    samples: list[Sample],
    capacity: bool = False,
) -> None:
    while True:
        t = now()
        bindings: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with session.get(f"{gateway}/prism/health") as response:
                if response.status == 200:
                    health = await response.json()
                    for b in health.get("bindings", []):
                        bindings[b["binding"]] = {
                            "state": b["state"],
                            "in_flight": b.get("in_flight", 0),
                            "ramp": b.get("ramp"),
                            "error_rate": (b.get("window") or {}).get("error_rate"),
                        }
        rule: dict[str, Any] | None = None
        if capacity:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                async with session.get(f"{gateway}/prism/capacity") as response:
                    if response.status == 200:
                        rule = await response.json()
        samples.append(Sample(t, bindings, rule))
        await asyncio.sleep(max(0.02, 0.25 * scenario.time_scale))


def _read_ledgers(directory: Path, replicas: int) -> list[LedgerRow]:
    rows: list[LedgerRow] = []
    for i in range(replicas):
        path = directory / f"ledger{i}.sqlite"
        if not path.exists():
            continue
        with contextlib.closing(sqlite3.connect(path)) as db:
            for model, provider, upstream, tin, tout, nanos, org in db.execute(
                "SELECT model, provider, upstream_model, input_tokens, output_tokens, cost_nanos,"
                " org FROM ledger WHERE traffic = 'customer' AND provider IS NOT NULL"
            ):
                binding = f"{provider}/{upstream}"
                rows.append(LedgerRow(model, binding, tin, tout, nanos / 1e9, org))
    return rows


async def run_variant(scenario: Scenario, variant: Variant, directory: Path) -> VariantRun:
    """Start the variant's processes, play the scenario through them, stop them."""
    processes = Processes(directory / "logs")
    calls: list[Call] = []
    samples: list[Sample] = []
    try:
        fake = await processes.fake_upstream()
        redis = await processes.redis() if scenario.replicas > 1 else None
        urls = []
        keys: dict[str, str] = {}
        for i in range(scenario.replicas):
            port = free_port()
            ini = write_gateway_config(
                scenario, variant, directory / "gateway",
                fake_url=fake, port=port, replica=i, redis_url=redis,
            )  # fmt: skip
            if i == 0:
                keys = await create_keys(ini, organisations(scenario))
            try:
                urls.append(await processes.gateway(f"gateway{i}", ini, port))
            except LabError as exc:
                raise LabError(
                    f"variant {variant.name} (durations scaled by {scenario.time_scale:g}): {exc}"
                ) from None
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as control:
            weather = Weather(scenario, fake, control)
            await weather.step(0.0)
            start = loop.time()

            def now() -> float:
                return (loop.time() - start) / scenario.time_scale

            background = [
                asyncio.create_task(weather.follow(now)),
                asyncio.create_task(
                    _sample(scenario, urls[0], control, now, samples, variant.metrics is not None)
                ),
            ]
            try:
                await drive_traffic(scenario, urls, now, calls, keys)
            finally:
                for task in background:
                    task.cancel()
                results = await asyncio.gather(*background, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    raise result
            await weather.finish()
    finally:
        await processes.close()
    ledger = _read_ledgers(directory / "gateway", scenario.replicas) if variant.billing else []
    return VariantRun(variant, calls, samples, ledger, weather.sick_calls)


async def create_keys(ini: Path, orgs: Sequence[str]) -> dict[str, str]:
    """One key per organisation, made with ``prism keys create`` in the variant's key database.

    The keys live in this process only: the command's output is read here and
    never written to a log (the database keeps their hashes).
    """
    keys: dict[str, str] = {}
    for org in orgs:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prism_proxy.cli", "keys", "create",
            "--org", org, "--scopes", "*", "--config", str(ini),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL, cwd=ini.parent,
        )  # fmt: skip
        out, err = await process.communicate()
        found = [w for w in out.decode().split() if w.startswith("sk-prism-")]
        if process.returncode != 0 or len(found) != 1:
            raise LabError(f"prism keys create --org {org} failed: {err.decode().strip()[-300:]}")
        keys[org] = found[0]
    return keys


def prices(scenario: Scenario) -> Mapping[str, Mapping[str, float]]:
    """binding → {"input", "output"} per million tokens, from the catalog's chain lines."""
    out: dict[str, Mapping[str, float]] = {}
    for model in scenario.models.values():
        for line in model["chain"]:
            price = line.get("price")
            if isinstance(price, dict):
                out[f"{line['provider']}/{line['model']}"] = price
    return out
