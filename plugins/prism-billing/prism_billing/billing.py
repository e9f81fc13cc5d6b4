"""Billing for one generation: its settings, price book and the kept ledger writer."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import attrs

from prism_proxy import Call, ConfigError, Generation, Settlement, hookimpl

from .admission import REFUSED
from .ledger import LedgerWriter
from .pg_ledger import PostgresLedgerWriter, SchemaTooNew
from .prices import PriceBook, format_nanos
from .rows import LedgerRow, build_row
from .settings import PLUGIN_NAME, BillingSettings
from .spool import SpoolOpenFailed

__all__ = [
    "COST_HEADER",
    "PLUGIN_OBJECT",
    "AnyLedgerWriter",
    "Billing",
    "LedgerLifecycle",
    "billing_of",
]

COST_HEADER = "x-prism-cost"
#: The name each generation's Billing is registered under.
PLUGIN_OBJECT = "billing.ledger"
#: Either ledger's writer: both have ``start``, ``record(row)`` and ``close``.
AnyLedgerWriter = LedgerWriter | PostgresLedgerWriter
#: What opening a PostgreSQL ledger can fail with: refused or unreachable (OSError,
#: timeouts), refused by the server (auth, no such database), a newer schema.
_PG_OPEN_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    SchemaTooNew,
)


@attrs.define(eq=False)
class LedgerLifecycle:
    """The ledger writer as a kept object: opened before the first call, closed last."""

    writer: AnyLedgerWriter
    source: str

    async def lifecycle(self) -> AsyncIterator[None]:
        writer = self.writer
        if isinstance(writer, PostgresLedgerWriter):
            try:
                await writer.start()
            except SpoolOpenFailed as exc:
                await writer.close()
                spool_key = f"[prism:{PLUGIN_NAME}] spool_path"
                raise ConfigError(self.source, spool_key, str(exc)) from None
            except _PG_OPEN_ERRORS as exc:
                await writer.close()
                # asyncpg's messages name host, database and user, never the password.
                raise ConfigError(
                    self.source,
                    f"[prism:{PLUGIN_NAME}] ledger_url",
                    f"cannot open the ledger {writer.name}: {type(exc).__name__}: {exc}",
                ) from None
            yield
            await writer.close()
            return
        try:
            await writer.start()
        except (sqlite3.Error, OSError) as exc:
            await writer.close()
            raise ConfigError(
                self.source,
                f"[prism:{PLUGIN_NAME}] ledger_path",
                f"cannot open the ledger {writer.path}: {exc}",
            ) from None
        yield
        await self.writer.close()


@attrs.define(eq=False)
class Billing:
    """One generation's billing: its settings and prices, and the kept ledger writer."""

    settings: BillingSettings
    prices: PriceBook
    writer: AnyLedgerWriter
    #: Monotonic seconds, for a call's duration (the generation's clock).
    clock: Callable[[], float] = time.monotonic
    #: Wall-clock seconds for row timestamps and days; tests inject their own.
    now: Callable[[], float] = time.time

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> Awaitable[None] | None:
        if call.model is None or call.extensions.get(REFUSED):
            # Refused before a model was resolved (bad input, unknown model, auth):
            # nothing could have served, and the model name is unchecked caller input.
            # Or refused because no row could be kept: nothing served, nowhere to write.
            call.response_headers[COST_HEADER] = "0"
            return None
        duration_ms = round((self.clock() - call.received_at) * 1000)
        row = build_row(call, settlement, self.prices, now=self.now(), duration_ms=duration_ms)
        committed = self.writer.record(row)
        # Runs before the settling call resumes (callbacks run in the order added).
        committed.add_done_callback(functools.partial(self._committed, call, row))
        return committed

    def _committed(self, call: Call, row: LedgerRow, committed: asyncio.Future[None]) -> None:
        """The row is durable: now tell the caller the amount.

        The header is set only after the commit, so a response that carries
        ``x-prism-cost`` always has its row.
        """
        if committed.cancelled() or committed.exception() is not None:
            return
        cost = format_nanos(row.cost_nanos)
        call.response_headers[COST_HEADER] = cost
        call.access["cost"] = cost
        if row.cost_nanos and row.provider is not None:
            self.writer.telemetry.count(
                "prism_cost_total", row.cost_nanos / 1e9, model=row.model, provider=row.provider
            )


def billing_of(generation: Generation) -> Billing | None:
    """The billing of ``generation``, or None when billing is off."""
    found = generation.plugin(PLUGIN_OBJECT)
    return found if isinstance(found, Billing) else None
