"""The prism_proxy entry point: registers provider kind ``openai`` and its catalog keys."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    PARAM_RULE_KEYS,
    CatalogKeys,
    Generation,
    ProviderFactory,
    check_param_rules,
    hookimpl,
)

from .provider import OpenAIProvider


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"openai": OpenAIProvider}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_generation(generation: Generation) -> None:
    # Nothing per call: the provider objects are the core's; only the lines are checked.
    check_param_rules(generation.catalog, "openai")
