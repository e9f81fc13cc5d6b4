"""The prism_proxy entry point ``metrics``: ``GET /metrics``, the per-call hooks, and the
``TELEMETRY`` service (the Prometheus exporter every plugin reports to)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from prism_proxy import (
    GATEWAY,
    SHARED_STATE,
    TELEMETRY,
    Commands,
    Config,
    Generation,
    Offer,
    SharedState,
    background,
    hookimpl,
    provide,
)

from .board import add_board_routes
from .capacity import CapacityRule, Peaks
from .cli import add_commands
from .exporter import CONTENT_TYPE, Exporter
from .fleet import exchange_peaks
from .hooks import MetricsHooks
from .settings import SECTION, MetricsSettings

__all__ = ["HOOKS_NAME", "metrics_of"]

#: The names each generation's :class:`MetricsHooks` and :class:`CapacityRule` have.
HOOKS_NAME = "metrics.hooks"
CAPACITY_NAME = "metrics.capacity"
#: How often every worker brings its read-at-scrape values up to date, so that
#: a scrape answered by another worker sees them.
SYNC_S = 1.0
#: How often every worker folds what its calls counted into prometheus-client (its
#: shared files under ``--workers``): how late another worker's scrape may be.
FOLD_S = 0.25


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]]:
    return [provide(TELEMETRY, lambda: _exporter(generation))]


def _exporter(generation: Generation) -> Exporter:
    settings = MetricsSettings.from_config(generation.config)
    # Kept across generations: its counters must never go back to zero.
    return generation.keep(
        ("metrics", settings.org_label), lambda: Exporter(org_label=settings.org_label)
    )


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = MetricsSettings.from_config(generation.config)
    exporter = generation.services.get(TELEMETRY)
    if not isinstance(exporter, Exporter):
        return  # the operator chose another plugin's exporter: nothing here to serve
    peaks = generation.keep(("metrics.peaks",), lambda: Peaks(generation.clock))
    rule = CapacityRule(generation.catalog, peaks, settings.capacity_window_s, settings.capacity_k)
    hooks = MetricsHooks(exporter, generation, rule)
    generation.register(hooks, HOOKS_NAME)
    generation.register(rule, CAPACITY_NAME)
    shared = generation.services.get(SHARED_STATE)
    generation.cleanup_ctx.append(lambda: _sync(hooks, shared))


async def _sync(hooks: MetricsHooks, shared: SharedState | None) -> AsyncIterator[None]:
    """While the generation serves, keep this worker's read-at-scrape values current
    (and, with prism-redis, the fleet's capacity peaks)."""

    tally = hooks.exporter.tally

    async def run() -> None:
        ticks = round(SYNC_S / FOLD_S)
        for tick in itertools.count(1):
            await asyncio.sleep(FOLD_S)
            tally.fold()
            if tick % ticks:
                continue
            if shared is not None:
                # prism-redis marks itself degraded and logs the outage once.
                with contextlib.suppress(Exception):
                    await exchange_peaks(shared, hooks.rule)
            hooks.refresh()

    try:
        async with background(run, "prism-metrics-sync"):
            yield
    finally:
        tally.fold()  # a worker stopping leaves nothing counted behind


def metrics_of(generation: Generation) -> MetricsHooks | None:
    hooks = generation.plugin(HOOKS_NAME)
    return hooks if isinstance(hooks, MetricsHooks) else None


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: MetricsSettings}


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/prism/capacity", capacity)
    add_board_routes(app)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition: no secrets in it (labels are bounded catalog values)."""
    hooks = metrics_of(request.app[GATEWAY].current)
    if hooks is None:
        return web.Response(status=404, text="metrics are off\n")
    return web.Response(body=hooks.render(), headers={"Content-Type": CONTENT_TYPE})


async def capacity(request: web.Request) -> web.Response:
    """The capacity rule's evidence: every limited line's minute peaks, each tier's k."""
    rule = request.app[GATEWAY].current.plugin(CAPACITY_NAME)
    if not isinstance(rule, CapacityRule):
        return web.Response(status=404, text="metrics are off\n")
    return web.json_response(rule.report())
