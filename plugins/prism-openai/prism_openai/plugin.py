"""The prism_proxy entry point: provider kind ``openai``, its catalog keys, its profiles."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    PARAM_RULE_KEYS,
    CatalogKeys,
    Generation,
    ParamProfile,
    ProviderFactory,
    check_param_rules,
    hookimpl,
)

from .provider import OpenAIProvider

#: Reasoning models (o1, o3, o4-mini, gpt-5 …) refuse the sampling parameters and
#: take their output cap as ``max_completion_tokens`` (``max_tokens`` is refused).
OPENAI_REASONING = ParamProfile(
    drop=(
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
    ),
    rename={"max_tokens": "max_completion_tokens"},
    kinds=frozenset({"openai"}),
    description="OpenAI reasoning models (o1, o3, o4-mini, gpt-5)",
)


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"openai": OpenAIProvider}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_param_profiles() -> Mapping[str, ParamProfile]:
    return {"openai-reasoning": OPENAI_REASONING}


@hookimpl
def prism_generation(generation: Generation) -> None:
    # Options live on the catalog's provider tables: a [prism:openai] key would be ignored.
    generation.config.section("openai").check_keys(())
    # Nothing per call: the provider objects are the core's; only the lines are
    # checked, the catalog's own and those other plugins add (routing rules).
    check_param_rules(
        generation.catalog, "openai", generation.param_profiles, generation.added_lines()
    )
