"""The prism_proxy entry point ``keys``."""

from __future__ import annotations

import logging

from aiohttp import web

from prism_proxy import GATEWAY, Catalog, Commands, Config, hookimpl

from .auth import AUTH_PLUGIN_NAME, KeysAuth, models_guard
from .cli import add_commands
from .keyring import KeyRing
from .settings import KeysSettings
from .store import KeyStore

__all__ = ["KEYRING"]

KEYRING = web.AppKey("prism_keys_ring", KeyRing)

log = logging.getLogger("prism.keys")


@hookimpl
def prism_configure(config: Config, catalog: Catalog) -> None:
    KeysSettings.from_config(config)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    settings = KeysSettings.from_config(config)
    if settings is None:
        # Not configured: implement no authentication at all, so the core's
        # "open to anyone" start-up warning stays true and loud.
        return
    ring = KeyRing(KeyStore(settings.db_path), settings.refresh_s)
    app[KEYRING] = ring
    app.cleanup_ctx.append(ring.run)
    app.middlewares.append(models_guard(ring))
    gateway = app[GATEWAY]
    gateway.pm.register(KeysAuth(ring, gateway.counters), AUTH_PLUGIN_NAME)
    log.info(
        "keys: API keys required, from %s (re-read every %g s)",
        settings.db_path,
        settings.refresh_s,
    )


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)
