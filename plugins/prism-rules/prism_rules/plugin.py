"""The prism_proxy entry point ``rules``."""

from __future__ import annotations

from aiohttp import web

from prism_proxy import (
    GATEWAY,
    Binding,
    Call,
    Catalog,
    CatalogKeys,
    Config,
    ModelSpec,
    Route,
    hookimpl,
)

from .metadata import BODY_FIELD, HEADER, read_metadata
from .rules import CATALOG_KEY, RuleBook, compile_catalog

__all__ = ["RULEBOOK"]

RULEBOOK = web.AppKey("prism_rules_book", RuleBook)


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(model=frozenset({CATALOG_KEY}))


@hookimpl
def prism_configure(config: Config, catalog: Catalog) -> None:
    config.section("rules").check_keys(())  # nothing to set; typos still stop start-up
    compile_catalog(catalog)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    catalog = app[GATEWAY].catalog
    app[RULEBOOK] = compile_catalog(catalog, catalog.line_keys)


@hookimpl
def prism_catalog_lines(catalog: Catalog) -> list[tuple[str, Binding]]:
    return compile_catalog(catalog, catalog.line_keys).own_lines(catalog)


@hookimpl
def prism_call_start(call: Call, request: web.Request) -> None:
    call.metadata = read_metadata(request.headers.getall(HEADER, []), call.body.get(BODY_FIELD))


@hookimpl
def prism_select_route(call: Call, model: ModelSpec) -> Route | None:
    if call.request is not None:
        return call.request.app[RULEBOOK].route(call, model)
    if CATALOG_KEY not in model.options:
        return None
    # A call made without a request (none exist in the core today) cannot reach the
    # compiled rules; refusing is safer than letting a pinned region leak.
    route = Route(bindings=(), name="rules-unavailable", cross_tier=False)
    route.notes.append("rules: no request to evaluate them with")
    return route
