from __future__ import annotations

from typing import Any

import pytest
from prism_fake_upstream import FakeUpstream

from prism_proxy import hookimpl


def two_provider_catalog(
    fake: FakeUpstream, first: str = "err500", second: str = "ok"
) -> dict[str, Any]:
    """The README's example catalog, pointed at the test's fake upstream."""
    return {
        "providers": {
            "alpha": {"kind": "openai", "base_url": fake.base_url(second)},
            "beta": {"kind": "openai", "base_url": fake.base_url(first)},
        },
        "models": {
            "chat-a": {
                "tier": "standard",
                "chain": [
                    {"provider": "beta", "model": "up-beta"},
                    {"provider": "alpha", "model": "up-alpha"},
                ],
            },
            "embed-a": {"chain": [{"provider": "alpha", "model": "text-embed"}]},
        },
    }


@pytest.fixture
def catalog(prism_fake: FakeUpstream) -> dict[str, Any]:
    return two_provider_catalog(prism_fake)


class Recorder:
    """A plugin that remembers every settlement and attempt it is shown."""

    def __init__(self) -> None:
        self.settled: list[tuple[Any, Any]] = []
        self.attempts: list[Any] = []

    @hookimpl
    def prism_settle(self, call: Any, settlement: Any) -> None:
        self.settled.append((call, settlement))

    @hookimpl
    def prism_on_attempt(self, call: Any, attempt: Any) -> None:
        self.attempts.append(attempt)

    def settlements_for(self, request_id: str) -> list[Any]:
        return [s for c, s in self.settled if c.request_id == request_id]


@pytest.fixture
def recorder(prism_plugin: Any) -> Recorder:
    rec = Recorder()
    prism_plugin(rec, "test-recorder")
    return rec
