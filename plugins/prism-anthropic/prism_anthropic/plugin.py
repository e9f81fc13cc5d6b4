"""The prism_proxy entry point ``anthropic``: provider kind, catalog keys, error model."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import (
    GATEWAY,
    PARAM_RULE_KEYS,
    Attempt,
    Call,
    Catalog,
    CatalogKeys,
    Config,
    ProviderFactory,
    UpstreamResult,
    Verdict,
    check_param_rules,
    hookimpl,
)

from .classify import classify_anthropic
from .provider import AnthropicProvider


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"anthropic": AnthropicProvider}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_configure(config: Config, catalog: Catalog) -> None:
    check_param_rules(catalog, "anthropic")


@hookimpl(tryfirst=True)
def prism_classify(call: Call, attempt: Attempt, result: UpstreamResult) -> Verdict | None:
    if result.wire != "anthropic":
        return None
    markers: tuple[str, ...] = ()
    if call.request is not None:
        markers = call.request.app[GATEWAY].config.permanent_markers
    return classify_anthropic(result, markers)
