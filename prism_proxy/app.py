"""The app factory: configuration + plugins + catalog -> an aiohttp application."""

from __future__ import annotations

import asyncio
import logging
import random as random_module
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from aiohttp import web

from .catalog import load_catalog
from .config import Config, load_config
from .connections import SERVER
from .endpoints import add_routes, add_unmatched_route
from .errors import ConfigError
from .gateway import GATEWAY, Gateway
from .plugins import make_plugin_manager
from .providers import ProviderFactory

__all__ = ["create_app"]

log = logging.getLogger("prism")


def create_app(
    config: Config | str | Path | None = None,
    *,
    plugins: Iterable[tuple[object, str]] = (),
    load_entrypoints: bool = True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    random: Callable[[], float] = random_module.random,
) -> web.Application:
    """Build the gateway application.

    ``config`` is a loaded :class:`Config`, a path to a config file, or None
    to search from the current directory.  ``plugins`` registers extra
    ``(plugin, name)`` pairs beside the installed ones (tests, embedding
    apps); ``clock``, ``sleep`` and ``random`` replace the time source, the
    pause between retries and the jitter source (tests).  The result can be
    run alone or mounted with ``add_subapp``; run it with
    ``handler_cancellation=True`` so a caller that disconnects cancels its
    upstream request at once (``prism serve`` does).  Raises ``ConfigError``.
    """
    if not isinstance(config, Config):
        config = load_config(config)
    pm = make_plugin_manager(config, extra_plugins=plugins, load_entrypoints=load_entrypoints)
    kinds = _provider_kinds(config, pm.hook.prism_provider_kinds())
    catalog = load_catalog(
        config.catalog_path,
        data=config.catalog_data,
        kinds=kinds,
        extra_keys=[keys for keys in pm.hook.prism_catalog_keys() if keys is not None],
    )
    pm.hook.prism_configure(config=config, catalog=catalog)
    providers = {name: kinds[spec.kind](spec) for name, spec in catalog.providers.items()}
    gw = Gateway(
        config=config,
        catalog=catalog,
        pm=pm,
        providers=providers,
        clock=clock,
        sleep=sleep,
        random=random,
    )

    app = web.Application(client_max_size=config.max_body_bytes)
    app[GATEWAY] = gw
    add_routes(app)
    app.cleanup_ctx.append(gw.lifecycle)
    app.on_shutdown.append(gw.on_shutdown)
    pm.hook.prism_app_setup(app=app, config=config)
    add_unmatched_route(app)
    app.on_response_prepare.append(_server_header)
    if _open_to_anyone(gw):
        app.on_startup.append(_warn_open)
    return app


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp would name itself and the Python version: nothing a caller needs.
    response.headers["Server"] = SERVER


def _provider_kinds(
    config: Config, answers: Iterable[Mapping[str, ProviderFactory] | None]
) -> dict[str, ProviderFactory]:
    kinds: dict[str, ProviderFactory] = {}
    for answer in answers:
        for kind, factory in (answer or {}).items():
            if kind in kinds:
                raise ConfigError(
                    config.source, "plugins", f"two plugins register provider kind {kind!r}"
                )
            kinds[kind] = factory
    return kinds


def _open_to_anyone(gw: Gateway) -> bool:
    impls = gw.pm.hook.prism_authenticate.get_hookimpls()
    return all(impl.plugin_name == "prism.default-auth" for impl in impls)


async def _warn_open(app: web.Application) -> None:
    log.warning(
        "NO AUTHENTICATION PLUGIN IS ENABLED: this gateway answers ANYONE who can reach it "
        "and spends your upstream credit on their behalf. Install and enable an auth plugin "
        "(e.g. prism-keys) before exposing it beyond this machine."
    )
