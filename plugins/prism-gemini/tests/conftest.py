"""Gateways over Gemini lines of the fake upstream (its scenarios name the lines)."""

from __future__ import annotations

from typing import Any

import pytest

from prism_proxy.testing import Sleeps

PLUGINS = ["gemini"]
KEY_ENV = "PRISM_TEST_GEMINI_KEY"
KEY = "AIzaSy-test-secret-0123456789"


@pytest.fixture
def gemini_key() -> str:
    """The API key the Gemini lines read from ``PRISM_TEST_GEMINI_KEY``."""
    return KEY


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def gemini_catalog(prism_fake, monkeypatch):
    """A catalog whose model ``m`` chains Gemini lines, one per scenario, in order."""
    monkeypatch.setenv(KEY_ENV, KEY)

    def catalog(*scenarios: str, **model: Any) -> dict[str, Any]:
        return {
            "providers": {
                name: {
                    "kind": "gemini",
                    "base_url": prism_fake.base_url(name),
                    "api_key_env": KEY_ENV,
                }
                for name in scenarios
            },
            "models": {
                "m": {
                    "chain": [{"provider": name, "model": f"gemini-{name}"} for name in scenarios],
                    **model,
                }
            },
        }

    return catalog


@pytest.fixture
def start(gemini_catalog, prism_gateway, sleeps):
    """A gateway over ``gemini_catalog(*scenarios)``, retries' pauses recorded, random fixed."""

    async def start(*scenarios: str, config: dict[str, Any] | None = None, **model: Any):
        return await prism_gateway(
            gemini_catalog(*scenarios, **model),
            config=config,
            sleep=sleeps,
            random=lambda: 0.5,
            load_plugins=PLUGINS,
        )

    return start


def attempt_log(headers) -> list[tuple[str, ...]]:
    """``x-prism-attempt-log`` as (binding, outcome, status) triples, in order."""
    return [tuple(entry.split()[:3]) for entry in headers["x-prism-attempt-log"].split("; ")]


@pytest.fixture
def log():
    return attempt_log
