"""The prism_proxy entry point ``scoring``: order the lines of a chain group per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Mapping
from typing import Any

from prism_proxy import (
    Attempt,
    Binding,
    Call,
    CatalogKeys,
    Generation,
    ModelSpec,
    Outcome,
    Route,
    hookimpl,
)

from .scores import Scores, Stat, draw_order, scores_of
from .settings import GROUP_KEY, PLUGIN_NAME, WEIGHT_KEY, Line, Settings, read_lines

__all__ = ["ORDER_NAME", "GroupOrder", "order_of"]

#: The name this generation's object is registered under (absent: no chain uses ``group``).
ORDER_NAME = f"{PLUGIN_NAME}.order"

#: What counts against a line.  An empty answer is one too: nothing comes
#: faster than nothing, and measured as an answer it would make the line look
#: fastest, to lead calls it then costs an attempt (or serves nothing).
#: ``cancelled`` (the caller left) and ``request_error`` (the request was at
#: fault) say nothing about the line.
_ERRORS = frozenset(
    {
        Outcome.TRANSIENT,
        Outcome.TIMEOUT,
        Outcome.BROKEN_STREAM,
        Outcome.PERMANENT,
        Outcome.RATE_LIMITED,
        Outcome.EMPTY,
    }
)
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_OK = Outcome.OK


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {PLUGIN_NAME: Settings}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=frozenset({GROUP_KEY, WEIGHT_KEY}))


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = Settings.from_config(generation.config)
    lines = read_lines(generation)
    if not lines:
        return  # no chain uses ``group``: nothing registered, nothing to pay per call
    catalog = generation.catalog
    scores = generation.keep((PLUGIN_NAME,), Scores)
    keys = {b.id: (b.id, catalog.fingerprint(b)) for b in lines}
    order = GroupOrder(
        lines,
        {binding_id: scores.stat(key) for binding_id, key in keys.items()},
        settings,
        clock=generation.clock,
        random=generation.random,
    )
    kept = set(keys.values())

    async def serving() -> AsyncIterator[None]:
        # From the moment this generation serves, lines it no longer has are forgotten.
        scores.retain(kept)
        yield

    generation.cleanup_ctx.append(serving)
    generation.register(order, ORDER_NAME)


class GroupOrder:
    """One generation's grouped lines, their scores, and the hooks that use them."""

    def __init__(
        self,
        lines: Mapping[Binding, Line],
        stats: Mapping[str, Stat],
        settings: Settings,
        *,
        clock: Callable[[], float],
        random: Callable[[], float],
    ) -> None:
        self.lines = lines
        self.stats = stats
        self.settings = settings
        self.clock = clock
        self.random = random

    @hookimpl(wrapper=True)
    def prism_select_route(
        self, call: Call, model: ModelSpec
    ) -> Generator[None, Route | None, Route | None]:
        route = yield
        if route is not None:
            self.order(route)
        return route

    @hookimpl
    def prism_on_attempt(self, call: Call, attempt: Attempt) -> None:
        stat = self.stats.get(attempt.binding.id)
        if stat is None:
            return
        outcome = attempt.outcome
        if outcome is _OK:  # only an answer with something in it measures the line
            latency = attempt.first_byte_ms
            stat.observe(self.clock(), self.settings.half_life_s, latency_ms=latency, error=False)
        elif outcome in _ERRORS:
            stat.observe(self.clock(), self.settings.half_life_s, latency_ms=None, error=True)

    def order(self, route: Route) -> None:
        """Reorder each run of consecutive same-group lines of ``route``, in place.

        Everything else keeps its position: ungrouped lines, the order
        between runs, ``route.skipped``.  Each run of two or more lines adds
        a note with the order drawn, so the attempt record shows it.
        """
        bindings = route.bindings
        lines = self.lines
        start = 0
        for binding in bindings:
            if binding in lines:
                break
            start += 1
        else:
            return  # no grouped line: nothing allocated, nothing changed
        result = list(bindings[:start])
        end = len(bindings)
        index = start
        while index < end:
            line = lines.get(bindings[index])
            if line is None:
                result.append(bindings[index])
                index += 1
                continue
            stop = index + 1
            while stop < end:
                other = lines.get(bindings[stop])
                if other is None or other.group != line.group:
                    break
                stop += 1
            run = bindings[index:stop]
            if len(run) > 1:
                run = self.draw(run)
                listed = ", ".join(b.id for b in run)
                route.notes.append(f"{PLUGIN_NAME}: group {line.group} order {listed}")
            result.extend(run)
            index = stop
        route.bindings = tuple(result)

    def draw(self, run: tuple[Binding, ...]) -> tuple[Binding, ...]:
        """One run's order: power of two choices on the live scores."""
        scores = scores_of([self.stats.get(b.id) for b in run], self.settings.error_penalty_ms)
        weights = [self.lines[b].weight for b in run]
        return tuple(run[i] for i in draw_order(scores, weights, self.random))


def order_of(generation: Generation) -> GroupOrder | None:
    """The object ordering ``generation``'s groups (None: no chain uses ``group``)."""
    found = generation.plugin(ORDER_NAME)
    return found if isinstance(found, GroupOrder) else None
