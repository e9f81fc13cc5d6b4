"""Shared pieces for the cache tests: a catalog on the fake upstream, callers by organisation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from prism_proxy import Principal, hookimpl

HI = [{"role": "user", "content": "hi"}]
PRICE = {"input": 1.0, "output": 2.0}


def catalog(
    fake: Any, scenario: str = "a", model: dict[str, Any] | None = None, **line: Any
) -> dict[str, Any]:
    return {
        "providers": {
            scenario: {"kind": "openai", "base_url": fake.base_url(scenario)},
            "claude": {"kind": "anthropic", "base_url": fake.base_url("c")},
        },
        "models": {
            "m": {
                "retries": 0,
                "chain": [{"provider": scenario, "model": "up", **line}],
                **(model or {}),
            },
            # Anthropic has no seed, and its SDK no longer sends a temperature: "all".
            "c": {
                "retries": 0,
                "cache": "all",
                "chain": [{"provider": "claude", "model": "claude-up"}],
            },
        },
    }


@attrs.define
class Callers:
    """A stand-in auth plugin: ``x-test-key: KEY@ORG``, with the organisation's settings
    (``org_settings``) as prism-keys hands them over."""

    org_settings: dict[str, dict[str, Any]] = attrs.field(factory=dict)

    @hookimpl
    def prism_authenticate(self, call: Any) -> Principal | None:
        value = call.request.headers.get("x-test-key")
        if not value:
            return None
        key, _, org = value.partition("@")
        return Principal(key_id=key, org=org or None, settings=self.org_settings.get(org, {}))


@pytest.fixture
def callers(prism_plugin: Any) -> Callers:
    found = Callers()
    prism_plugin(found, "test-callers")
    return found
