"""Helpers of the azure-openai tests: a catalog builder and a settlement recorder."""

from __future__ import annotations

from typing import Any

from prism_proxy import Settlement, hookimpl

KEY = "az-secret-key-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]


def azure(fake: Any, scenario: str, **options: Any) -> dict[str, Any]:
    """An azure-openai provider table on the fake's ``scenario``."""
    return {
        "kind": "azure-openai",
        "base_url": fake.base_url(scenario),
        "api_key_env": "TEST_AZURE_KEY",
        **options,
    }


def catalog(
    providers: dict[str, dict[str, Any]], chain: list[tuple[str, str]], **model: Any
) -> dict[str, Any]:
    return {
        "providers": providers,
        "models": {"m": {"chain": [{"provider": p, "model": name} for p, name in chain], **model}},
    }


class Settled:
    """Every settlement the gateway hands ``prism_settle``, in order."""

    def __init__(self) -> None:
        self.all: list[Settlement] = []

    @hookimpl
    def prism_settle(self, call: Any, settlement: Settlement) -> None:
        self.all.append(settlement)
