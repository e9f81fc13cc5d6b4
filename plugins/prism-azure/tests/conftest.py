"""Fixtures of the azure-openai tests."""

from __future__ import annotations

from typing import Any

import pytest

from .azure_support import KEY, Settled


@pytest.fixture(autouse=True)
def azure_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_AZURE_KEY", KEY)
    return KEY


@pytest.fixture
def settled(prism_plugin: Any) -> Settled:
    recorder = Settled()
    prism_plugin(recorder, "test-settled")
    return recorder
