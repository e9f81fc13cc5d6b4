"""The prism_proxy entry point ``rules``."""

from __future__ import annotations

from prism_proxy import Binding, Call, CatalogKeys, Generation, ModelSpec, Route, hookimpl

from .metadata import BODY_FIELD, HEADER, read_metadata
from .rules import CATALOG_KEY, RuleBook, compile_catalog

__all__ = ["PLUGIN_NAME", "RoutingRules"]

PLUGIN_NAME = "rules"


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(model=frozenset({CATALOG_KEY}))


def _book(generation: Generation) -> RuleBook:
    catalog = generation.catalog
    return generation.memo(PLUGIN_NAME, lambda: compile_catalog(catalog, catalog.line_keys))


@hookimpl
def prism_generation(generation: Generation) -> None:
    generation.config.section(PLUGIN_NAME).check_keys(())  # nothing to set; typos still stop
    generation.register(RoutingRules(_book(generation)), f"{PLUGIN_NAME}.book")


@hookimpl
def prism_catalog_lines(generation: Generation) -> list[tuple[str, Binding]]:
    return _book(generation).own_lines(generation.catalog)


class RoutingRules:
    """One generation's compiled rules and the hooks that apply them."""

    def __init__(self, book: RuleBook) -> None:
        self.book = book

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        call.metadata = read_metadata(
            call.request.headers.getall(HEADER, []), call.body.get(BODY_FIELD)
        )

    @hookimpl
    def prism_select_route(self, call: Call, model: ModelSpec) -> Route | None:
        return self.book.route(call, model)
