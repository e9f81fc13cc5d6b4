"""The prism_proxy entry point ``gemini``: provider kinds, wire, translation, error model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from prism_proxy import (
    PARAM_RULE_KEYS,
    CatalogKeys,
    Endpoint,
    Generation,
    ProviderFactory,
    Translation,
    Usage,
    Wire,
    WireErrors,
    hookimpl,
    provider_generation,
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
    provider_generation(generation, PLUGIN_NAME, KINDS, WireErrors("gemini", classify_gemini))

    async def clocks() -> AsyncIterator[None]:
        # Providers are built after this hook: token lifetimes keep the generation's
        # clock from its start on (a test's manual clock too).
        for provider in generation.providers.values():
            if isinstance(provider, VertexProvider):
                provider.clock = generation.time.now
        yield

    generation.cleanup_ctx.append(clocks)
