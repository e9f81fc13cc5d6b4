"""The prism_proxy entry point ``azure``: provider kind ``azure-openai`` and its error model."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    PARAM_RULE_KEYS,
    Attempt,
    Call,
    CatalogKeys,
    Generation,
    ProviderFactory,
    UpstreamResult,
    Verdict,
    check_param_rules,
    hookimpl,
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
    # Options live on the catalog's provider tables: a [prism:azure] key would be ignored.
    generation.config.section(PLUGIN_NAME).check_keys(())
    check_param_rules(generation.catalog, KIND, generation.param_profiles, generation.added_lines())
    providers = frozenset(
        name for name, spec in generation.catalog.providers.items() if spec.kind == KIND
    )
    if providers:
        generation.register(AzureErrors(providers), f"{PLUGIN_NAME}.errors")


class AzureErrors:
    """Azure OpenAI's error model, for the lines of this generation's Azure providers."""

    def __init__(self, providers: frozenset[str]) -> None:
        self.providers = providers

    @hookimpl(tryfirst=True)
    def prism_classify(
        self, call: Call, attempt: Attempt, result: UpstreamResult
    ) -> Verdict | None:
        if attempt.binding.provider not in self.providers:
            return None
        return classify_azure(result)
