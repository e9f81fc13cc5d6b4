"""Running the gateway: listening, draining on SIGTERM, and the event loop choice."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import attrs
from aiohttp import web

from .config import Config
from .connections import ConnectionGuard, GuardedSite, default_limit
from .gateway import GATEWAY

__all__ = ["Listening", "listen", "listen_options", "run", "serve"]

log = logging.getLogger("prism")

#: The young generation's collection threshold while serving (CPython's default
#: is 700).  A call allocates a few hundred short-lived objects; at the default,
#: the collector ran every ~20 streamed calls, and each run cost ~150 µs.
GC_YOUNG_THRESHOLD = 10_000


@attrs.define(eq=False)
class Listening:
    """An app accepting connections; ``stop()`` drains in-flight calls, then cancels the rest."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def listen(
    app: web.Application,
    host: str,
    port: int,
    *,
    grace_s: float,
    header_timeout_s: float = 10.0,
    keepalive_timeout_s: float = 75.0,
    max_connections: int | None = None,
    counters: dict[str, int] | None = None,
) -> Listening:
    """Start ``app`` on ``host:port`` (0 picks a free port).

    Handler cancellation is on: a caller that disconnects cancels its
    handler, which closes the upstream connection at once.  On stop, the
    listener closes first, in-flight calls get ``grace_s`` to finish, then
    the rest are cancelled (and settle as aborted).  Connections are
    guarded (see :mod:`.connections`): a request head must arrive within
    ``header_timeout_s``, idle keep-alive connections close after
    ``keepalive_timeout_s``, and beyond ``max_connections`` (default: 90%
    of the open-file soft limit) new connections are refused at once.
    """
    if max_connections is None:
        max_connections, soft = default_limit()
        log.info(
            "accepting at most %d connections (90%% of the open-file limit %d)",
            max_connections,
            soft,
        )
    guard = ConnectionGuard(header_timeout_s, max_connections, counters)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=grace_s)
    try:
        # setup() runs the app's start-up contexts; a failing one must not
        # leave the ones before it (pools, background tasks) running.
        await runner.setup()
        site = GuardedSite(
            runner, host, port, guard=guard, keepalive_timeout_s=keepalive_timeout_s
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    return Listening(runner, host, bound_port)


def listen_options(config: Config) -> dict[str, Any]:
    """The keyword arguments of :func:`listen` that ``config`` sets."""
    return {
        "grace_s": config.shutdown_grace_s,
        "header_timeout_s": config.header_timeout_s,
        "keepalive_timeout_s": config.keepalive_timeout_s,
        "max_connections": config.max_connections,
    }


async def serve(
    app: web.Application,
    config: Config,
    *,
    started: Callable[[Listening], Awaitable[None]] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain for ``shutdown_grace_s``."""
    counters = app[GATEWAY].counters if GATEWAY in app else None
    listening = await listen(
        app, config.listen.host, config.listen.port, counters=counters, **listen_options(config)
    )
    log.info("Prism listening on %s (config: %s)", listening.url, config.source)
    _settle_heap()
    if started is not None:
        await started(listening)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("draining: in-flight calls have %.0f s to finish", config.shutdown_grace_s)
    await listening.stop()
    log.info("stopped")


def _settle_heap() -> None:
    """Leave what start-up built out of every future collection; collect young objects rarer.

    Only for a process Prism owns (``prism serve``): an app mounted in
    someone else's process leaves the collector alone.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(main)
