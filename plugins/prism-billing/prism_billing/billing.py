"""Billing for one gateway app: its settings, price book and ledger writer."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Callable

import attrs
from aiohttp import web

from prism_proxy import Call, ConfigError, Settlement

from .ledger import LedgerWriter
from .prices import PriceBook, format_nanos
from .rows import LedgerRow, build_row
from .settings import PLUGIN_NAME, BillingSettings

__all__ = ["BILLING", "COST_HEADER", "Billing"]

COST_HEADER = "x-prism-cost"


@attrs.define(eq=False)
class Billing:
    settings: BillingSettings
    prices: PriceBook
    writer: LedgerWriter
    #: Wall-clock seconds for row timestamps and days; tests inject their own.
    now: Callable[[], float] = time.time

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: open the ledger before the first call, flush and close it last."""
        try:
            await self.writer.start()
        except (sqlite3.Error, OSError) as exc:
            await self.writer.close()
            raise ConfigError(
                self.settings.source,
                f"[prism:{PLUGIN_NAME}] ledger_path",
                f"cannot open the ledger {self.writer.path}: {exc}",
            ) from None
        yield
        await self.writer.close()

    def row_for(self, call: Call, settlement: Settlement, *, duration_ms: int) -> LedgerRow:
        return build_row(call, settlement, self.prices, now=self.now(), duration_ms=duration_ms)

    async def commit(self, call: Call, row: LedgerRow) -> None:
        """Make the row durable, then tell the caller the amount.

        The header is set only after the commit, so a response that carries
        ``x-prism-cost`` always has its row.
        """
        await self.writer.record(row)
        call.response_headers[COST_HEADER] = format_nanos(row.cost_nanos)


#: Set on the app only when billing is on.
BILLING = web.AppKey("prism_billing", Billing)
