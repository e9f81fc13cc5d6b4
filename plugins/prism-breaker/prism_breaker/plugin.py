"""The prism_proxy entry point ``breaker``: hook implementations, thin over :mod:`.runtime`."""

from __future__ import annotations

from collections.abc import Generator

from aiohttp import web

from prism_proxy import (
    GATEWAY,
    Attempt,
    Binding,
    Call,
    Catalog,
    Commands,
    Config,
    ConfigError,
    ModelSpec,
    Route,
    Settlement,
    hookimpl,
)

from .cli import add_commands
from .endpoints import add_routes
from .runtime import BREAKER, Breaker
from .settings import Settings
from .sqlite_store import SqliteStore, StoreError


@hookimpl
def prism_configure(config: Config, catalog: Catalog) -> None:
    Settings.from_config(config, catalog)  # fail start-up on a bad [prism:breaker]


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    gw = app[GATEWAY]
    settings = Settings.from_config(config, gw.catalog)
    store = SqliteStore(settings.state_path)
    try:
        store.check()
    except StoreError as exc:
        raise ConfigError(config.source, "[prism:breaker] state_path", str(exc)) from None
    breaker = Breaker(settings, gw.catalog, gw.clock, store, gw.counters)
    app[BREAKER] = breaker
    app.cleanup_ctx.append(breaker.lifecycle)
    add_routes(app)


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)


def _breaker(call: Call) -> Breaker | None:
    # State is per app; a call reaches its app through its request.
    if call.request is None:
        return None
    return call.request.app.get(BREAKER)


@hookimpl(wrapper=True)
def prism_select_route(call: Call, model: ModelSpec) -> Generator[None, Route | None, Route | None]:
    route = yield
    breaker = _breaker(call)
    if route is not None and breaker is not None:
        breaker.select(call, route)
    return route


@hookimpl
def prism_admit_attempt(call: Call, binding: Binding) -> str | None:
    breaker = _breaker(call)
    if breaker is None:
        return None
    return breaker.admit_attempt(call, binding)


@hookimpl
def prism_attempt_start(call: Call, attempt: Attempt) -> None:
    breaker = _breaker(call)
    if breaker is not None:
        breaker.attempt_start(call, attempt)


@hookimpl
def prism_on_attempt(call: Call, attempt: Attempt) -> None:
    breaker = _breaker(call)
    if breaker is not None:
        breaker.on_attempt(call, attempt)


@hookimpl
def prism_settle(call: Call, settlement: Settlement) -> None:
    breaker = _breaker(call)
    if breaker is not None:
        breaker.settle(call, settlement)
