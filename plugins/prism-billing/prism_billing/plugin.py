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

from prism_proxy import CatalogKeys, CheckLine, Commands, Config, Generation, OrgSetting, hookimpl

from .admission import GUARD_OBJECT, LedgerGuard
from .authorised import SETTING, PriceGate
from .billing import PLUGIN_OBJECT, Billing, LedgerLifecycle
from .check import check_ledger
from .export import add_ledger_command
from .ledger import LedgerWriter
from .pg_ledger import PostgresLedgerWriter
from .prices import PriceBook, price_lines
from .settings import PLUGIN_NAME, BillingSettings
from .spool import Spool
from .usage_api import USAGE_PATH, usage_handler


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=frozenset({"price"}))


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = BillingSettings.from_config(generation.config)
    catalog = generation.catalog
    # Every line a call could be served by, a routing rule's own lines included;
    # checked even with billing off: a typo in a price is still a mistake.
    lines = [*price_lines(catalog), *generation.added_lines()]
    prices = PriceBook.from_lines(
        catalog.source, lines, require=settings.enabled and settings.require_prices
    )
    if any(price is not None for price in prices.by_line.values()):
        generation.register(PriceGate(prices), "billing.price-gate")
    url = settings.ledger_url
    if url is not None:
        # One writer (one pool, one spool) per database, batch size and spool,
        # kept across reloads like the SQLite writer.
        spool_path, spool_max = settings.spool_path, settings.spool_max_bytes
        pg = generation.keep(
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
        pg.writer.serve(generation, settings.commit_delay_ms / 1000)
        generation.register(Billing(settings, prices, pg.writer, generation.clock), PLUGIN_OBJECT)
        if isinstance(pg.writer, PostgresLedgerWriter):  # always: kept under a ledger_url key
            generation.register(LedgerGuard(pg.writer), GUARD_OBJECT)
        return
    path = settings.ledger_path
    if path is None:
        return
    # One writer per ledger file and write settings, kept across reloads: its
    # group commit and its connection serve every generation that bills into
    # that file alike.  New write settings get a writer of their own (SQLite
    # serialises the two while the old generation drains).
    kept = generation.keep(
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
    kept.writer.serve(generation, settings.commit_delay_ms / 1000)
    billing = Billing(settings, prices, kept.writer, generation.clock)
    generation.register(billing, PLUGIN_OBJECT)


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
