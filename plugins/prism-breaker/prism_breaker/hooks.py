"""This plugin's object in each generation: the per-call hooks and the ``BREAKER`` service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any

from prism_proxy import (
    BREAKER,
    Attempt,
    Binding,
    Call,
    Catalog,
    Generation,
    ModelSpec,
    Route,
    Settlement,
    hookimpl,
)

from .runtime import Breaker
from .settings import Settings

__all__ = ["BreakerHooks", "breaker_of", "hooks_of"]


def hooks_of(generation: Generation) -> BreakerHooks | None:
    """This plugin's object in ``generation`` (None: the plugin is not active)."""
    hooks = generation.services.get(BREAKER)
    return hooks if isinstance(hooks, BreakerHooks) else None


def breaker_of(generation: Generation) -> Breaker | None:
    """The breaker ``generation`` routes with (None: the plugin is not active)."""
    hooks = hooks_of(generation)
    return hooks.breaker if hooks is not None else None


class BreakerHooks:
    """One generation's view of the kept breaker: its settings, its catalog, the hooks.

    Also what other plugins see of the breaker: the ``BREAKER`` service (a
    :class:`prism_proxy.BreakerView`).
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
