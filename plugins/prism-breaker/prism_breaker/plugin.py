"""The prism_proxy entry point ``breaker``: hook implementations, thin over :mod:`.runtime`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Hashable
from typing import Any

from aiohttp import web

from prism_proxy import (
    BREAKER_ROLE,
    STORE_ROLE,
    Attempt,
    Binding,
    BreakerStore,
    BreakerView,
    Call,
    Catalog,
    CatalogKeys,
    Commands,
    Config,
    Generation,
    ModelSpec,
    Route,
    Settlement,
    StoreProvider,
    hookimpl,
)

from .cli import add_commands
from .endpoints import add_routes
from .runtime import Breaker
from .settings import Settings
from .sqlite_store import SqliteStore


@hookimpl
def prism_generation(generation: Generation) -> None:
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
    hooks = BreakerHooks(breaker, settings, catalog, generation.number)
    generation.cleanup_ctx.append(hooks.serving)
    view: BreakerView = hooks  # what other plugins read under BREAKER_ROLE: type-checked here
    generation.register(view, BREAKER_ROLE)


def _store(
    generation: Generation, settings: Settings
) -> tuple[Hashable, Callable[[], BreakerStore]]:
    """The store a plugin offers under ``breaker.store`` (prism-redis), else the SQLite file."""
    provider: StoreProvider | None = generation.plugin(STORE_ROLE)
    if provider is not None:
        return provider.store_key, lambda: provider.breaker_store(settings)
    return settings.state_path, lambda: SqliteStore(settings.state_path)


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


def breaker_of(generation: Generation) -> Breaker | None:
    """The breaker ``generation`` routes with (None: the plugin is not active)."""
    hooks = generation.plugin(BREAKER_ROLE)
    return hooks.breaker if isinstance(hooks, BreakerHooks) else None


class BreakerHooks:
    """One generation's view of the kept breaker: its settings, its catalog, the hooks.

    Also what other plugins see of the breaker (a :class:`prism_proxy.BreakerView`,
    registered under ``prism_proxy.BREAKER_ROLE``).
    """

    def __init__(
        self, breaker: Breaker, settings: Settings, catalog: Catalog, generation: int
    ) -> None:
        self.breaker = breaker
        # The per-call hooks go straight to the part that serves them.
        self.admission = breaker.admission
        self.settings = settings
        self.catalog = catalog
        self.generation = generation

    @property
    def probe_status(self) -> dict[str, Any] | None:
        return self.breaker.probe_status

    @probe_status.setter
    def probe_status(self, status: dict[str, Any] | None) -> None:
        self.breaker.probe_status = status

    def health(
        self, *, with_text: bool, capacity: Callable[[Binding], dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        return self.breaker.health(with_text=with_text, capacity=capacity)

    def probe_result(
        self, binding_id: str, passed: bool, detail: str, *, opens_trial: bool
    ) -> None:
        self.breaker.probe_result(binding_id, passed, detail, opens_trial=opens_trial)

    async def serving(self) -> AsyncIterator[None]:
        """From the moment this generation starts, the breaker judges by its catalog."""
        self.breaker.adopt(self.settings, self.catalog, self.generation)
        yield

    @hookimpl(wrapper=True)
    def prism_select_route(
        self, call: Call, model: ModelSpec
    ) -> Generator[None, Route | None, Route | None]:
        route = yield
        if route is not None:
            self.admission.select(call, route)
        return route

    @hookimpl(trylast=True)  # may answer with an awaitable: the others decide first
    def prism_admit_attempt(
        self, call: Call, binding: Binding
    ) -> str | Awaitable[str | None] | None:
        return self.admission.admit_attempt(call, binding)

    @hookimpl
    def prism_attempt_start(self, call: Call, attempt: Attempt) -> None:
        self.admission.attempt_start(call, attempt)

    @hookimpl
    def prism_on_attempt(self, call: Call, attempt: Attempt) -> None:
        evidence = self.breaker.is_evidence(self.catalog, attempt.binding)
        self.admission.on_attempt(call, attempt, evidence=evidence)

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> None:
        self.admission.settle(call, settlement)
