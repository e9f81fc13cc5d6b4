"""The gateway's state for one app: configuration, catalog, plugins and providers."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import pluggy
from aiohttp import web

from .call import Call, Settlement
from .catalog import Catalog
from .config import Config
from .providers import Provider

__all__ = ["GATEWAY", "Gateway", "direct_caller"]

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
    #: Every ``prism_*`` hook as the hot path calls it (see :func:`direct_caller`), or
    #: None when nobody implements it, so the hot path can skip it outright.
    hot: Any = attrs.field(factory=types.SimpleNamespace)

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.pm.hook

    def refresh_hooks(self) -> None:
        """Look the hooks up again (plugins may register during app setup)."""
        callers = {
            name: getattr(self.pm.hook, name)
            for name in dir(self.pm.hook)
            if name.startswith("prism_")
        }
        self.hot = types.SimpleNamespace(
            **{name: direct_caller(caller) for name, caller in callers.items()}
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
            settle = self.hot.prism_settle
            pending = settle(call=call, settlement=settlement) if settle is not None else None
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


def direct_caller(caller: pluggy.HookCaller) -> Callable[..., Any] | None:
    """How the hot path calls a hook: None when nobody implements it; the one
    implementation itself when there is exactly one and it wraps nothing;
    else pluggy's caller.

    pluggy's general machinery (argument checks, wrappers, result lists) costs
    more than a typical implementation; with one plain implementation the
    outcome is the same, results and exceptions alike.  pluggy's call tracing
    does not see hooks called directly.
    """
    impls = caller.get_hookimpls()
    if not impls:
        return None
    if len(impls) > 1 or impls[0].hookwrapper or impls[0].wrapper:
        return caller
    function, names = impls[0].function, tuple(impls[0].argnames)
    if caller.spec is not None and caller.spec.opts.get("firstresult"):

        def first(**kwargs: Any) -> Any:
            return function(*[kwargs[name] for name in names])

        return first

    def collected(**kwargs: Any) -> list[Any]:
        result = function(*[kwargs[name] for name in names])
        return [] if result is None else [result]

    return collected


GATEWAY = web.AppKey("prism_gateway", Gateway)
