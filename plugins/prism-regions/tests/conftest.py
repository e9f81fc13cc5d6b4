"""Shared pieces: a small test auth plugin, a catalog with lines in three regions, an HTTP kit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import attrs
import pytest

from prism_proxy import Call, Principal, hookimpl

MESSAGES = [{"role": "user", "content": "hello"}]
PLUGINS = ["openai", "regions"]
#: Each provider's region; ``plain`` declares none.
REGIONS: dict[str, str | None] = {
    "us": "us-east-1",
    "eu": "eu-west-1",
    "de": "eu-central-1",
    "plain": None,
}
ORG = "x-test-org"
ORG_REGIONS = "x-test-org-regions"


class OrgAuth:
    """Test authentication: ``x-test-org`` names the organisation, ``x-test-org-regions``
    its ``regions`` setting (parsed with the declared parser, as an auth plugin that
    keeps organisations does).  No ``x-test-org``: a caller without an organisation."""

    @hookimpl
    def prism_authenticate(self, call: Call) -> Principal | None:
        org = call.request.headers.get(ORG)
        if org is None:
            return None
        settings: dict[str, Any] = {}
        text = call.request.headers.get(ORG_REGIONS)
        if text is not None:
            settings["regions"] = call.generation.org_settings["regions"].parse(text)
        return Principal(key_id=f"key-{org}", org=org, settings=settings)


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
        """The attempt log without the elapsed milliseconds."""
        return [e.rsplit(" ", 1)[0] if e.endswith("ms") else e for e in self.log]

    @property
    def provider(self) -> str | None:
        return self.headers.get("x-prism-provider")

    @property
    def region(self) -> str | None:
        return self.headers.get("x-prism-region")

    @property
    def code(self) -> str | None:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        return error.get("code") if isinstance(error, dict) else None


def provider(fake: Any, name: str) -> dict[str, Any]:
    table: dict[str, Any] = {"kind": "openai", "base_url": fake.base_url(name)}
    if REGIONS.get(name) is not None:
        table["region"] = REGIONS[name]
    return table


def line(name: str, model: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"provider": name, "model": model or f"up-{name}", **extra}


@attrs.define
class Kit:
    fake: Any
    regions: dict[str, str | None] = REGIONS

    @staticmethod
    def skipped(name: str, model: str | None = None, kind: str = "skipped") -> str:
        """The attempt-log entry of ``name``'s line left out (or vetoed) for its region."""
        return (
            f"{name}/{model or 'up-' + name} {kind} region: {REGIONS[name] or 'none'} not allowed"
        )

    def catalog(self, *names: str, **model: Any) -> dict[str, Any]:
        """Providers for every region above; model ``m`` chains ``names`` in order."""
        return {
            "providers": {name: provider(self.fake, name) for name in REGIONS},
            "models": {"m": {"chain": [line(n) for n in names], **model}},
        }

    async def chat(
        self,
        gw: Any,
        model: str = "m",
        *,
        org: str | None = None,
        org_regions: str | None = None,
        regions: str | Iterable[str] | None = None,
        headers: Mapping[str, str] | None = None,
        **body: Any,
    ) -> Answer:
        sent: list[tuple[str, str]] = list((headers or {}).items())
        if org is not None:
            sent.append((ORG, org))
        if org_regions is not None:
            sent.append((ORG_REGIONS, org_regions))
        if isinstance(regions, str):
            sent.append(("x-prism-regions", regions))
        elif regions is not None:
            sent.extend(("x-prism-regions", value) for value in regions)
        payload = {"model": model, "messages": MESSAGES, **body}
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gw.base_url + "/chat/completions", json=payload, headers=sent
            ) as response:
                raw = await response.read()
                data: Any = raw
                if response.content_type == "application/json":
                    data = await response.json()
                return Answer(response.status, dict(response.headers), data)


async def no_wait(seconds: float) -> None:
    """The gateway's sleep in these tests: retry pauses take no time."""


StartGateway = Callable[..., Awaitable[Any]]


@pytest.fixture
def kit(prism_fake: Any) -> Kit:
    return Kit(prism_fake)


@pytest.fixture
def start(prism_gateway: Any, prism_plugin: Any) -> StartGateway:
    """``await start(catalog, plugins=[...extra installed plugins], sections=...)``:
    the gateway with prism-openai, prism-regions and the test auth plugin."""
    prism_plugin(OrgAuth(), "test-auth")

    async def started(
        catalog: Mapping[str, Any], *, plugins: Iterable[str] = (), **kwargs: Any
    ) -> Any:
        kwargs.setdefault("sleep", no_wait)
        return await prism_gateway(catalog, load_plugins=[*PLUGINS, *plugins], **kwargs)

    return started
