"""The prism_proxy entry point ``metrics``: ``GET /metrics`` and the per-call hooks.

``tryfirst`` in ``prism_generation``: the exporter must be on
``generation.telemetry`` before the other plugins hand it to their objects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from prism_proxy import GATEWAY, Config, Generation, hookimpl

from .board import add_board_routes
from .exporter import CONTENT_TYPE, Exporter
from .hooks import MetricsHooks
from .settings import MetricsSettings

__all__ = ["HOOKS_NAME", "metrics_of"]

#: The name each generation's :class:`MetricsHooks` is registered under.
HOOKS_NAME = "metrics.hooks"
#: How often every worker brings its read-at-scrape values up to date, so that
#: a scrape answered by another worker sees them.
SYNC_S = 1.0


@hookimpl(tryfirst=True)
def prism_generation(generation: Generation) -> None:
    settings = MetricsSettings.from_config(generation.config)
    exporter = generation.keep(
        ("metrics", settings.org_label), lambda: KeptExporter(settings.org_label)
    )
    generation.telemetry = exporter.exporter
    hooks = MetricsHooks(exporter.exporter, generation)
    generation.register(hooks, HOOKS_NAME)
    generation.cleanup_ctx.append(lambda: _sync(hooks))


class KeptExporter:
    """The exporter, kept across generations (its counters must never go back to zero)."""

    def __init__(self, org_label: bool) -> None:
        self.exporter = Exporter(org_label=org_label)

    async def lifecycle(self) -> AsyncIterator[None]:
        yield


async def _sync(hooks: MetricsHooks) -> AsyncIterator[None]:
    """While the generation serves, keep this worker's read-at-scrape values current."""

    async def run() -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            hooks.refresh()

    task = asyncio.create_task(run(), name="prism-metrics-sync")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def metrics_of(generation: Generation) -> MetricsHooks | None:
    hooks = generation.plugin(HOOKS_NAME)
    return hooks if isinstance(hooks, MetricsHooks) else None


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app.router.add_get("/metrics", metrics)
    add_board_routes(app)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition: no secrets in it (labels are bounded catalog values)."""
    hooks = metrics_of(request.app[GATEWAY].current)
    if hooks is None:
        return web.Response(status=404, text="metrics are off\n")
    return web.Response(body=hooks.render(), headers={"Content-Type": CONTENT_TYPE})
