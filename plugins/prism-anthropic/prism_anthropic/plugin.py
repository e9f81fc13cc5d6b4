"""The prism_proxy entry point ``anthropic``: provider kind, catalog keys, error model."""

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
    # Options live on the catalog's provider tables: a [prism:anthropic] key would be ignored.
    generation.config.section(PLUGIN_NAME).check_keys(())
    check_param_rules(
        generation.catalog, "anthropic", generation.param_profiles, generation.added_lines()
    )
    generation.register(
        AnthropicErrors(generation.config.permanent_markers), f"{PLUGIN_NAME}.errors"
    )


class AnthropicErrors:
    """Anthropic's error model, with one generation's extra permanent markers."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers

    @hookimpl(tryfirst=True)
    def prism_classify(
        self, call: Call, attempt: Attempt, result: UpstreamResult
    ) -> Verdict | None:
        if result.wire != "anthropic":
            return None
        return classify_anthropic(result, self.markers)
