"""The prism_proxy entry point: registers provider kind ``openai``."""

from __future__ import annotations

from collections.abc import Mapping

from prism_proxy import ProviderFactory, hookimpl

from .provider import OpenAIProvider


@hookimpl
def prism_provider_kinds() -> Mapping[str, ProviderFactory]:
    return {"openai": OpenAIProvider}
