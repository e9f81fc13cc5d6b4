"""The app factory: configuration + plugins + catalog -> an aiohttp application."""

from __future__ import annotations

import logging
import random as random_module
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web

from .call import new_id
from .clock import Clock, split_clock
from .config import Config, load_config
from .connections import SERVER
from .endpoints import add_routes, add_unmatched_route
from .gateway import GATEWAY, Gateway
from .plugins import authenticating_plugins
from .record import REQUEST_ID_HEADER

__all__ = ["create_app"]

log = logging.getLogger("prism")


def create_app(
    config: Config | str | Path | None = None,
    *,
    plugins: Iterable[tuple[object, str]] = (),
    load_entrypoints: bool = True,
    clock: Clock | Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    random: Callable[[], float] = random_module.random,
) -> web.Application:
    """Build the gateway application and its first generation.

    ``config`` is a loaded :class:`Config`, a path to a config file, or None
    to search from the current directory.  ``plugins`` registers extra
    ``(plugin, name)`` pairs beside the installed ones (tests, embedding
    apps); ``clock`` (a :class:`~prism_proxy.Clock`, e.g. a test's
    ``ManualClock``), ``sleep`` and ``random`` replace the time deadlines,
    budgets and the stream watchdog keep to, the pause between retries and
    the jitter source (tests).  A bare ``() -> float`` for ``clock`` only
    stamps calls and budgets; timers then stay on the loop.  The result can be
    run alone or mounted with ``add_subapp``; run it with
    ``handler_cancellation=True`` so a caller that disconnects cancels its
    upstream request at once (``prism serve`` does).  Building touches no file
    and no network (that happens when the app starts).  Raises ``ConfigError``.
    """
    if not isinstance(config, Config):
        config = load_config(config)
    timers, now, pause = split_clock(clock, sleep)
    gateway = Gateway.for_config(
        config,
        plugins=tuple(plugins),
        load_entrypoints=load_entrypoints,
        time=timers,
        clock=now,
        sleep=pause,
        random=random,
    )
    app = web.Application(client_max_size=config.max_body_bytes)
    app[GATEWAY] = gateway
    add_routes(app)
    app.cleanup_ctx.append(gateway.lifecycle)
    app.on_shutdown.append(gateway.on_shutdown)
    gateway.current.pm.hook.prism_app_setup(app=app, config=config)
    add_unmatched_route(app)
    app.on_response_prepare.append(_every_response)
    if _open_to_anyone(gateway):
        app.on_startup.append(_warn_open)
    return app


async def _every_response(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    # aiohttp would name itself and the Python version: nothing a caller needs.
    headers["Server"] = SERVER
    # A call set its own id (it is in its log line and ledger row); every other
    # answer (a 404, a 405, a plugin's route) still gets one to quote.
    if REQUEST_ID_HEADER not in headers:
        headers[REQUEST_ID_HEADER] = new_id("req_")


def _open_to_anyone(gateway: Gateway) -> bool:
    return not authenticating_plugins(gateway.current.pm)


async def _warn_open(app: web.Application) -> None:
    log.warning(
        "NO AUTHENTICATION PLUGIN IS ENABLED: this gateway answers ANYONE who can reach it "
        "and spends your upstream credit on their behalf. Install and enable an auth plugin "
        "(e.g. prism-keys) before exposing it beyond this machine."
    )
