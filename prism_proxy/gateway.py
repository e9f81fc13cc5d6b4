"""The gateway's state for one app: configuration, catalog, plugins and providers."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import pluggy
from aiohttp import web

from .call import Call, Settlement
from .catalog import Catalog
from .config import Config
from .providers import Provider

__all__ = ["GATEWAY", "Gateway"]

log = logging.getLogger("prism")
call_log = logging.getLogger("prism.calls")


@attrs.define(eq=False)
class Gateway:
    config: Config
    catalog: Catalog
    pm: pluggy.PluginManager
    providers: dict[str, Provider]
    #: Monotonic seconds, the pause between retries and the jitter source; tests inject their own.
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    random: Callable[[], float] = random.random
    #: Event counters (e.g. ``chain_exceeded_max_time``), served at GET /prism/stats.
    counters: collections.Counter[str] = attrs.field(factory=collections.Counter)
    ready: bool = False
    draining: bool = False
    #: Hooks that have at least one implementation; the hot path skips the others.
    used: frozenset[str] = frozenset()

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.pm.hook

    def refresh_hooks(self) -> None:
        """Note which hooks anyone implements (plugins may register during app setup)."""
        self.used = frozenset(
            name
            for name in dir(self.pm.hook)
            if name.startswith("prism_") and getattr(self.pm.hook, name).get_hookimpls()
        )

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: open every provider's pool at start-up, close them at shutdown."""
        self.refresh_hooks()
        await asyncio.gather(*(provider.start() for provider in self.providers.values()))
        self.ready = True
        yield
        self.ready = False
        await asyncio.gather(*(provider.close() for provider in self.providers.values()))

    async def on_shutdown(self, app: web.Application) -> None:
        self.draining = True

    async def settle(self, call: Call, settlement: Settlement) -> bool:
        """Run ``prism_settle`` exactly once for ``call`` and log the call's summary line.

        Returns False when an implementation failed (its awaitable raised):
        the relay then withholds an answer it could not account for.
        """
        if call.settled:
            return True
        call.settled = True
        recorded = True
        try:
            pending = (
                self.hook.prism_settle(call=call, settlement=settlement)
                if "prism_settle" in self.used
                else None
            )
            if pending:
                # Shielded: a client leaving must not cut a ledger commit in half.
                await asyncio.shield(asyncio.gather(*pending))
        except Exception:
            log.exception("prism_settle failed for %s", call.request_id)
            recorded = False
        if call_log.isEnabledFor(logging.INFO):
            served = settlement.served
            call_log.info(
                "%s %s model=%r served=%s status=%s outcome=%s code=%s attempts=%d ms=%d",
                call.request_id,
                call.endpoint,
                call.model_name or "-",
                served.binding.id if served else "-",
                settlement.status,
                settlement.outcome,
                settlement.error_code or "-",
                len(call.attempts),
                (self.clock() - call.received_at) * 1000,
            )
        return recorded


GATEWAY = web.AppKey("prism_gateway", Gateway)
