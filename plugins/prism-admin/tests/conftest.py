"""A gateway with keys, billing and the admin API, and a client that calls it as each credential."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web

from .oidc_provider import Provider

ADMIN_TOKEN = "admin-token-for-tests"
ENV = "PRISM_ADMIN_TEST_TOKEN"
BASE = "/prism/admin"
#: Per million tokens.
PRICE = {"input": 1.0, "output": 2.0}


def catalog(fake: Any) -> dict[str, Any]:
    return {
        "providers": {"alpha": {"kind": "openai", "base_url": fake.base_url("ok")}},
        "models": {
            "m": {"retries": 0, "chain": [{"provider": "alpha", "model": "up", "price": PRICE}]},
            "n": {"retries": 0, "chain": [{"provider": "alpha", "model": "up2", "price": PRICE}]},
        },
    }


@attrs.define
class Api:
    """The admin API of one gateway, called with whichever credential a test names."""

    url: str
    session: aiohttp.ClientSession
    gateway: Any

    async def call(
        self, method: str, path: str, token: str | None = ADMIN_TOKEN, **kwargs: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session.request(
            method, self.url + BASE + path, headers=headers, **kwargs
        ) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()

    async def ok(self, method: str, path: str, token: str | None = ADMIN_TOKEN, **kw: Any) -> Any:
        status, body = await self.call(method, path, token, **kw)
        assert status in (200, 201), (method, path, status, body)
        return body


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def keys_section(engine: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if engine == "postgres":
        url = request.getfixturevalue("prism_postgres")
        return {"db_url": url, "refresh_s": 0.05}
    return {"db_path": "keys.db", "refresh_s": 0.05}


async def start(
    prism_gateway: Any,
    prism_fake: Any,
    prism_clock: Any,
    tmp_path: Path,
    keys_section: dict[str, Any],
    *,
    catalog_data: dict[str, Any] | None = None,
    plugins: tuple[str, ...] = (),
    admin: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Any:
    """A gateway with keys, billing, the admin API (and ``plugins``, with the ``extra``
    sections they read), on ``prism_clock``."""
    prism_fake.clock = prism_clock
    sections: dict[str, Any] = {"keys": keys_section, "billing": {"ledger_path": "ledger.db"}}
    if admin:
        sections["admin"] = admin
    sections.update(extra or {})
    return await prism_gateway(
        catalog_data or catalog(prism_fake),
        config={"admin_token_env": ENV},
        sections=sections,
        base_dir=tmp_path,
        clock=prism_clock,
        load_plugins=["keys", "admin", "billing", "openai", *plugins],
    )


@pytest.fixture
async def api(
    prism_gateway: Any,
    prism_fake: Any,
    prism_clock: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys_section: dict[str, Any],
) -> Any:
    monkeypatch.setenv(ENV, ADMIN_TOKEN)
    gateway = await start(prism_gateway, prism_fake, prism_clock, tmp_path, keys_section)
    async with aiohttp.ClientSession() as session:
        yield Api(gateway.url, session, gateway)


SECRET_ENV = "PRISM_ADMIN_TEST_OIDC_SECRET"
ROLES = "@example.com=admin, group:acme-admins=org-admin:acme"


@pytest.fixture
async def provider() -> Any:
    idp = Provider(client_id="prism-console", client_secret="s3cret")
    runner = web.AppRunner(idp.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    idp.url = f"http://127.0.0.1:{port}"
    yield idp
    await runner.cleanup()


@pytest.fixture
async def console(
    prism_gateway: Any,
    prism_fake: Any,
    prism_clock: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: Provider,
) -> Any:
    monkeypatch.setenv(ENV, ADMIN_TOKEN)
    monkeypatch.setenv(SECRET_ENV, provider.client_secret)
    return await start(
        prism_gateway,
        prism_fake,
        prism_clock,
        tmp_path,
        {"db_path": "keys.db", "refresh_s": 0.05},
        plugins=("limits",),
        admin={
            "session_s": 600,
            "oidc_issuer": provider.url,
            "client_id": provider.client_id,
            "client_secret_env": SECRET_ENV,
            "roles": ROLES,
        },
    )
