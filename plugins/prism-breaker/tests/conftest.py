"""Shared pieces for the breaker's tests: an injected clock and a small HTTP kit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import attrs
import pytest

MESSAGES = [{"role": "user", "content": "hello"}]
ADMIN_TOKEN = "breaker-admin-token"


class FakeTime:
    """The gateway's injected clock; retry pauses advance it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def log(self) -> list[str]:
        raw = self.headers.get("x-prism-attempt-log", "")
        return raw.split("; ") if raw else []

    @property
    def steps(self) -> list[str]:
        """The attempt log without the elapsed milliseconds, which vary from run to run."""
        return [e.rsplit(" ", 1)[0] if e.endswith("ms") else e for e in self.log]

    @property
    def provider(self) -> str | None:
        return self.headers.get("x-prism-provider")


@attrs.define
class Kit:
    """Talks to a gateway under test the way a caller and an operator would."""

    fake: Any

    def catalog(self, *names: str, **model: Any) -> dict[str, Any]:
        return {
            "providers": {n: {"kind": "openai", "base_url": self.fake.base_url(n)} for n in names},
            "models": {
                "m": {"chain": [{"provider": n, "model": f"up-{n}"} for n in names], **model}
            },
        }

    async def chat(self, gw: Any, model: str = "m", **body: Any) -> Answer:
        payload = {"model": model, "messages": MESSAGES, **body}
        async with aiohttp.ClientSession() as session:
            async with session.post(gw.base_url + "/chat/completions", json=payload) as response:
                raw = await response.read()
                data: Any = raw
                if response.content_type == "application/json":
                    data = await response.json()
                return Answer(response.status, dict(response.headers), data)

    async def health(self, gw: Any, token: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as session:
            async with session.get(gw.url + "/prism/health", headers=headers) as response:
                assert response.status == 200
                result: dict[str, Any] = await response.json()
                return result

    async def binding(self, gw: Any, binding_id: str) -> dict[str, Any]:
        for entry in (await self.health(gw))["bindings"]:
            if entry["binding"] == binding_id:
                return entry
        raise AssertionError(f"{binding_id} not in /prism/health")

    async def admin(
        self, gw: Any, method: str, path: str, json: Any = None, token: str | None = ADMIN_TOKEN
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as session:
            async with session.request(
                method, gw.url + path, json=json, headers=headers
            ) as response:
                return response.status, await response.json()

    async def eventually(self, check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
        """Wait (bounded) for something the background writer or refresher does."""
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.02)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def kit(prism_fake: Any) -> Kit:
    return Kit(prism_fake)


@pytest.fixture
def admin_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("BREAKER_TEST_ADMIN", ADMIN_TOKEN)
    return {"admin_token_env": "BREAKER_TEST_ADMIN"}
