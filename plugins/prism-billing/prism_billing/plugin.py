"""The prism_proxy entry point ``billing``.

Billing is on only when ``[prism:billing] ledger_path`` is set.  Everything
per gateway lives on its app under ``BILLING``; this module holds no state.
"""

from __future__ import annotations

from collections.abc import Awaitable

from aiohttp import web

from prism_proxy import (
    GATEWAY,
    Call,
    CatalogKeys,
    Commands,
    Config,
    Settlement,
    hookimpl,
)

from .billing import BILLING, COST_HEADER, Billing
from .export import add_ledger_command
from .ledger import LedgerWriter
from .prices import PriceBook, price_lines
from .settings import BillingSettings
from .usage_api import USAGE_PATH, usage_handler


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=frozenset({"price"}))


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_ledger_command(commands)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app.router.add_get(USAGE_PATH, usage_handler)
    settings = BillingSettings.from_config(config)
    gw = app[GATEWAY]
    # Every line a call could be served by, a routing rule's own lines included;
    # checked even with billing off: a typo in a price is still a mistake.
    lines = [*price_lines(gw.catalog)]
    for extra in gw.hook.prism_catalog_lines(catalog=gw.catalog):
        lines.extend(extra or ())
    prices = PriceBook.from_lines(
        gw.catalog.source, lines, require=settings.enabled and settings.require_prices
    )
    if settings.ledger_path is None:
        return
    writer = LedgerWriter(
        settings.ledger_path,
        synchronous=settings.synchronous,
        max_batch_rows=settings.max_batch_rows,
        counters=gw.counters,
    )
    billing = Billing(settings, prices, writer)
    app[BILLING] = billing
    app.cleanup_ctx.append(billing.lifecycle)


@hookimpl
def prism_settle(call: Call, settlement: Settlement) -> Awaitable[None] | None:
    request = call.request
    if request is None:
        return None
    billing = request.app.get(BILLING)
    if billing is None:
        return None
    if call.model is None:
        # Refused before a model was resolved (bad input, unknown model, auth):
        # nothing could have served, and the model name is unchecked caller input.
        call.response_headers[COST_HEADER] = "0"
        return None
    gw = request.app[GATEWAY]
    duration_ms = round((gw.clock() - call.received_at) * 1000)
    row = billing.row_for(call, settlement, duration_ms=duration_ms)
    return billing.commit(call, row)
