"""The prism_proxy entry point ``bedrock``: provider kind, wire, catalog keys, error model."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    PARAM_RULE_KEYS,
    Attempt,
    Call,
    CatalogKeys,
    Generation,
    ProviderFactory,
    Translation,
    UpstreamResult,
    Verdict,
    Wire,
    check_param_rules,
    hookimpl,
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
    # Options live on the catalog's provider tables: a [prism:bedrock] key would be ignored.
    generation.config.section(PLUGIN_NAME).check_keys(())
    check_param_rules(
        generation.catalog, "bedrock", generation.param_profiles, generation.added_lines()
    )
    generation.register(BedrockErrors(generation.config.permanent_markers), f"{PLUGIN_NAME}.errors")


class BedrockErrors:
    """Bedrock's error model, with one generation's extra permanent markers."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers

    @hookimpl(tryfirst=True)
    def prism_classify(
        self, call: Call, attempt: Attempt, result: UpstreamResult
    ) -> Verdict | None:
        if result.wire != "bedrock":
            return None
        return classify_bedrock(result, self.markers)
