"""The prism_proxy entry point ``gemini``: provider kinds, wire, translation, error model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from prism_proxy import (
    PARAM_RULE_KEYS,
    Attempt,
    Call,
    CatalogKeys,
    Endpoint,
    Generation,
    ProviderFactory,
    Translation,
    UpstreamResult,
    Usage,
    Verdict,
    Wire,
    check_param_rules,
    hookimpl,
)

from .answers import GeminiToOpenAIStream, embeddings_body, gemini_to_openai_body
from .classify import classify_gemini
from .provider import GeminiProvider, VertexProvider
from .translate import embeddings_request, openai_to_gemini
from .wire import GEMINI

PLUGIN_NAME = "gemini"
KINDS = ("gemini", "vertex")


def _request(body: dict[str, Any], provider: Any) -> tuple[dict[str, Any], list[str]]:
    if "messages" in body:
        return openai_to_gemini(body, provider)
    return embeddings_request(body, provider)


def _body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    if "embedding" in payload or "embeddings" in payload or "predictions" in payload:
        return embeddings_body(payload, usage)
    return gemini_to_openai_body(payload, usage)


FROM_OPENAI = Translation(
    client="openai",
    provider="gemini",
    endpoints={Endpoint.CHAT: Endpoint.CHAT, Endpoint.EMBEDDINGS: Endpoint.EMBEDDINGS},
    request=_request,
    body=_body,
    stream=lambda include_usage: GeminiToOpenAIStream(include_usage=include_usage),
)


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"gemini": GeminiProvider, "vertex": VertexProvider}


@hookimpl
def prism_wires() -> list[Wire | Translation]:
    return [GEMINI, FROM_OPENAI]


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(binding=PARAM_RULE_KEYS)


@hookimpl
def prism_generation(generation: Generation) -> None:
    # Options live on the catalog's provider tables: a [prism:gemini] key would be ignored.
    generation.config.section(PLUGIN_NAME).check_keys(())
    for kind in KINDS:
        check_param_rules(
            generation.catalog, kind, generation.param_profiles, generation.added_lines()
        )
    generation.register(GeminiErrors(generation.config.permanent_markers), f"{PLUGIN_NAME}.errors")

    async def clocks() -> AsyncIterator[None]:
        # Providers are built after this hook: token lifetimes keep the generation's
        # clock from its start on (a test's manual clock too).
        for provider in generation.providers.values():
            if isinstance(provider, VertexProvider):
                provider.clock = generation.time.now
        yield

    generation.cleanup_ctx.append(clocks)


class GeminiErrors:
    """Google's error model, with one generation's extra permanent markers."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers

    @hookimpl(tryfirst=True)
    def prism_classify(
        self, call: Call, attempt: Attempt, result: UpstreamResult
    ) -> Verdict | None:
        if result.wire != "gemini":
            return None
        return classify_gemini(result, self.markers)
