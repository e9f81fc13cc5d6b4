"""The prism_proxy entry point ``bedrock``: provider kind, wire, catalog keys, error model."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    PARAM_RULE_KEYS,
    CatalogKeys,
    Generation,
    ProviderFactory,
    Translation,
    Wire,
    WireErrors,
    hookimpl,
    provider_generation,
)

from .classify import classify_bedrock
from .provider import BedrockProvider
from .translate import FROM_OPENAI
from .wire import BEDROCK

PLUGIN_NAME = "bedrock"


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"bedrock": BedrockProvider}


@hookimpl
def prism_wires() -> list[Wire | Translation]:
    # Only from chat: Messages and Responses callers come through chat (the core composes).
    return [BEDROCK, FROM_OPENAI]


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_generation(generation: Generation) -> None:
    provider_generation(
        generation, PLUGIN_NAME, ("bedrock",), WireErrors("bedrock", classify_bedrock)
    )
