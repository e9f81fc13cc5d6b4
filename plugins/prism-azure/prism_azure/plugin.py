"""The prism_proxy entry point ``azure``: provider kind ``azure-openai`` and its error model."""

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

from .classify import classify_azure
from .provider import KIND, AzureOpenAIProvider

PLUGIN_NAME = "azure"


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {KIND: AzureOpenAIProvider}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_generation(generation: Generation) -> None:
    # OpenAI's wire, which openai lines speak too: the model reads only Azure's lines.
    provider_generation(
        generation,
        PLUGIN_NAME,
        (KIND,),
        WireErrors(AzureOpenAIProvider.wire, classify_azure),
        own_lines=True,
    )
