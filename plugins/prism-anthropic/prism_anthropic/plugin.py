"""The prism_proxy entry point ``anthropic``: provider kind, catalog keys, error model."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    PARAM_RULE_KEYS,
    CatalogKeys,
    Generation,
    ProviderFactory,
    WireErrors,
    hookimpl,
    provider_generation,
)

from .classify import classify_anthropic
from .provider import AnthropicProvider

PLUGIN_NAME = "anthropic"


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"anthropic": AnthropicProvider}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_generation(generation: Generation) -> None:
    provider_generation(
        generation, PLUGIN_NAME, ("anthropic",), WireErrors("anthropic", classify_anthropic)
    )
