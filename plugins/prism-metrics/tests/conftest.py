"""Shared pieces for the metrics tests: calls, and reading /metrics as Prometheus would."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

MESSAGES = [{"role": "user", "content": "the secret prompt text"}]


async def chat(url: str, model: str = "m", headers: dict[str, str] | None = None, **body: Any):
    payload = {"model": model, "messages": MESSAGES, **body}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json=payload, headers=headers or {}
        ) as response:
            await response.read()
            return response


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return await response.text()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample, keyed by (name, labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and wanted <= ls)
