"""The prism_proxy entry point ``breaker``: hook implementations, thin over :mod:`.runtime`."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

from aiohttp import web

from prism_proxy import (
    BREAKER,
    BREAKER_ROLE,
    BREAKER_STORE,
    OVERRIDES,
    STORE_ROLE,
    BreakerStore,
    CatalogKeys,
    Commands,
    Config,
    Generation,
    Offer,
    StoreProvider,
    hookimpl,
    provide,
)

from .admin_overrides import AdminOverrides
from .cli import add_commands
from .endpoints import add_routes
from .hooks import BreakerHooks, breaker_of
from .runtime import Breaker
from .settings import SECTION, Settings
from .sqlite_store import SqliteStore


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]]:
    return [
        provide(BREAKER, lambda: _build(generation)),
        # The admin API's door to overrides: it finds this generation's breaker when asked.
        provide(OVERRIDES, lambda: AdminOverrides(generation)),
    ]


@hookimpl
def prism_generation(generation: Generation) -> None:
    hooks = generation.services.get(BREAKER)
    if isinstance(hooks, BreakerHooks):  # another plugin's breaker may have been chosen
        generation.cleanup_ctx.append(hooks.serving)
        generation.register(hooks, BREAKER_ROLE)


def _build(generation: Generation) -> BreakerHooks:
    settings = Settings.from_config(generation.config, generation.catalog)
    catalog = generation.catalog
    key, make_store = _store(generation, settings)
    # One breaker per state store, kept across reloads: health and overrides
    # survive; each generation hands it its own settings and catalog.
    breaker = generation.keep(
        ("breaker", key),
        lambda: Breaker(
            settings,
            catalog,
            generation.clock,
            make_store(),
            generation.counters,
            generation.random,
        ),
    )
    return BreakerHooks(breaker, settings, catalog, generation.number)


def _store(
    generation: Generation, settings: Settings
) -> tuple[Hashable, Callable[[], BreakerStore]]:
    """The ``BREAKER_STORE`` service (prism-redis), else the SQLite file."""
    provider: StoreProvider | None = generation.services.get(BREAKER_STORE)
    if provider is None:
        # Before services a store was registered under this name; kept for one release.
        provider = generation.pm.get_plugin(STORE_ROLE)
        if provider is not None:
            warnings.warn(
                "registering a breaker store under prism_proxy.STORE_ROLE is deprecated: "
                "provide the BREAKER_STORE service from prism_services",
                DeprecationWarning,
                stacklevel=1,
            )
    if provider is not None:
        return provider.store_key, lambda: provider.breaker_store(settings)
    return settings.state_path, lambda: SqliteStore(settings.state_path)


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: Settings}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    # restore = "manual": a line whose passed trial waits for an operator's release.
    return CatalogKeys(binding=frozenset({"restore"}))


@hookimpl
def prism_workers(generation: Generation, count: int) -> str | None:
    breaker = breaker_of(generation)
    if breaker is None or breaker.fleet is not None:
        return None  # off, or its state is shared by every process already
    return (
        f"prism-breaker keeps each binding's health and its one trial caller in one "
        f"process; {count} workers would each keep their own and let {count} trial callers "
        "through. Run one worker, share the state through Redis (install prism-redis and "
        "set [prism:redis] url), or disable the breaker ([prism] disable = breaker)"
    )


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    add_routes(app)


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)
