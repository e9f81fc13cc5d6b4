"""The prism_proxy entry point ``billing``.

Billing is on only when ``[prism:billing] ledger_path`` (a SQLite file) or
``ledger_url`` (a PostgreSQL database) is set.  Each generation gets its own
:class:`Billing` (settings, prices); the ledger writer is kept across
generations, one per ledger.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from prism_proxy import (
    PRICING,
    SPEND,
    USAGE,
    CatalogKeys,
    CheckLine,
    Commands,
    Config,
    Generation,
    Offer,
    OrgSetting,
    hookimpl,
    provide,
)

from .admission import GUARD_OBJECT, LedgerGuard
from .authorised import SETTING, PriceGate
from .billing import PLUGIN_OBJECT, Billing, LedgerLifecycle
from .check import check_ledger
from .export import add_ledger_command
from .ledger import LedgerWriter
from .pg_ledger import PostgresLedgerWriter
from .prices import PriceBook, price_lines
from .settings import PLUGIN_NAME, BillingSettings
from .spend import BillingPricing, LedgerSpend
from .spool import Spool
from .usage_api import USAGE_PATH, usage_handler
from .usage_query import LedgerUsage


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=frozenset({"price"}))


def _settings(generation: Generation) -> BillingSettings:
    return generation.memo(
        "billing.settings", lambda: BillingSettings.from_config(generation.config)
    )


def _billing(generation: Generation) -> tuple[BillingSettings, PriceBook]:
    """The generation's settings and price book, built once: billing bills with the very
    prices the ``pricing`` service hands out, whichever asks first."""
    return generation.memo("billing.prices", lambda: _price_book(generation))


def _price_book(generation: Generation) -> tuple[BillingSettings, PriceBook]:
    settings = _settings(generation)
    # Every line a call could be served by, a routing rule's own lines included;
    # checked even with billing off: a typo in a price is still a mistake.
    lines = [*price_lines(generation.catalog), *generation.added_lines()]
    prices = PriceBook.from_lines(
        generation.catalog.source, lines, require=settings.enabled and settings.require_prices
    )
    return settings, prices


def _ledger(generation: Generation, settings: BillingSettings) -> LedgerLifecycle | None:
    """The kept ledger writer for ``settings`` (None: billing off); the same object for
    every ask in a generation, and across generations with the same ledger."""
    url = settings.ledger_url
    if url is not None:
        # One writer (one pool, one spool) per database, batch size and spool,
        # kept across reloads like the SQLite writer.
        spool_path, spool_max = settings.spool_path, settings.spool_max_bytes
        return generation.keep(
            ("billing", url, settings.max_batch_rows, spool_path, spool_max),
            lambda: LedgerLifecycle(
                PostgresLedgerWriter(
                    url,
                    max_batch_rows=settings.max_batch_rows,
                    counters=generation.counters,
                    spool=None
                    if spool_path is None
                    else Spool(spool_path, max_bytes=spool_max, counters=generation.counters),
                ),
                settings.source,
            ),
        )
    path = settings.ledger_path
    if path is None:
        return None
    # One writer per ledger file and write settings, kept across reloads: its
    # group commit and its connection serve every generation that bills into
    # that file alike.  New write settings get a writer of their own (SQLite
    # serialises the two while the old generation drains).
    return generation.keep(
        ("billing", path, settings.synchronous, settings.max_batch_rows),
        lambda: LedgerLifecycle(
            LedgerWriter(
                path,
                synchronous=settings.synchronous,
                max_batch_rows=settings.max_batch_rows,
                counters=generation.counters,
            ),
            settings.source,
        ),
    )


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]] | None:
    settings = _settings(generation)
    if not settings.enabled:
        return None

    def pricing() -> BillingPricing:
        # The very price book this generation's Billing charges with.
        return BillingPricing(settings.currency, _billing(generation)[1])

    def spend() -> LedgerSpend:
        kept = _ledger(generation, settings)
        assert kept is not None  # billing is on: there is a ledger
        return LedgerSpend(kept.writer)

    def usage() -> LedgerUsage:
        kept = _ledger(generation, settings)
        assert kept is not None  # billing is on: there is a ledger
        return LedgerUsage(settings.currency, kept.writer)

    return [provide(PRICING, pricing), provide(SPEND, spend), provide(USAGE, usage)]


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings, prices = _billing(generation)
    if any(price is not None for price in prices.by_line.values()):
        generation.register(PriceGate(prices), "billing.price-gate")
    kept = _ledger(generation, settings)
    if kept is None:
        return
    kept.writer.serve(generation, settings.commit_delay_ms / 1000)
    generation.register(Billing(settings, prices, kept.writer, generation.clock), PLUGIN_OBJECT)
    if isinstance(kept.writer, PostgresLedgerWriter):
        generation.register(LedgerGuard(kept.writer), GUARD_OBJECT)


@hookimpl
def prism_check(generation: Generation, offline: bool) -> Awaitable[list[CheckLine]]:
    return check_ledger(BillingSettings.from_config(generation.config), offline)


@hookimpl
def prism_org_settings() -> list[OrgSetting]:
    return [SETTING]


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_ledger_command(commands)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app.router.add_get(USAGE_PATH, usage_handler)


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {PLUGIN_NAME: BillingSettings}
