"""Each engine of ``[prism:responses] store`` through the real gateway and the openai SDK.

memory, SQLite, PostgreSQL (its own database) and Redis (its own key
prefix): a follow-up carries the conversation to the line, the owner alone
reads and deletes, ``store=False`` keeps nothing, ``ttl_s`` expires on the
gateway's clock, and what SQLite, PostgreSQL and Redis keep is seen by
another gateway of the same store (a restart, a replica).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from prism_proxy import Principal, hookimpl

LINE = "gpt-ok"
ANSWER = "Hello from up. This is the fake upstream answering."
ENGINES = ["memory", "sqlite", "postgres", "redis"]


class Callers:
    """A stand-in auth plugin: ``x-test-key: KEY@ORG`` names the caller."""

    @hookimpl
    def prism_authenticate(self, call: Any) -> Principal | None:
        value = call.request.headers.get("x-test-key")
        if not value:
            return None
        key, _, org = value.partition("@")
        return Principal(key_id=key, org=org or None)


def catalog(fake: Any) -> dict[str, Any]:
    return {
        "providers": {"p": {"kind": "openai", "base_url": fake.base_url(LINE)}},
        "models": {"m": {"chain": [{"provider": "p", "model": "up"}]}},
    }


def client(gw: Any, caller: str | None = "k1@acme") -> openai.AsyncOpenAI:
    return gw.openai(default_headers={"x-test-key": caller} if caller else None)


@pytest.fixture(params=ENGINES)
def store(request: Any, tmp_path: Any) -> dict[str, dict[str, Any]]:
    """The sections naming one engine's store (and its link), ``ttl_s`` 600."""
    engine = request.param
    found: dict[str, dict[str, Any]] = {"responses": {"store": engine, "ttl_s": 600}}
    if engine == "sqlite":
        found["responses"]["path"] = str(tmp_path / "responses.sqlite")
    elif engine == "postgres":
        found["responses"]["url"] = request.getfixturevalue("prism_postgres")
    elif engine == "redis":
        redis = request.getfixturevalue("prism_redis")
        found["redis"] = {"url": redis.url, "key_prefix": redis.prefix, "timeout_ms": 5000}
    return found


async def start(prism_gateway: Any, prism_fake: Any, sections: Any, **options: Any) -> Any:
    return await prism_gateway(
        catalog(prism_fake),
        sections=sections,
        plugins=[(Callers(), "callers")],
        load_plugins=["openai", "responses", "redis"],
        **options,
    )


async def test_a_conversation_is_kept_for_its_owner_only(prism_gateway, prism_fake, store):
    engine = store["responses"]["store"]
    gw = await start(prism_gateway, prism_fake, store)
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/readyz") as ready:
        assert (await ready.json())["responses"] == {"store": engine, "ttl_s": 600}
    sdk = client(gw)
    first = await sdk.responses.create(model="m", input="Hello")
    second = await sdk.responses.create(model="m", previous_response_id=first.id, input="More?")
    sent = prism_fake.requests(LINE)[-1].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "Hello"),
        ("assistant", ANSWER),
        ("user", "More?"),
    ]
    kept = await client(gw, "k2@acme").responses.retrieve(second.id)
    assert kept.output_text == ANSWER and kept.id == second.id
    for stranger in ("k3@globex", None):
        with pytest.raises(openai.NotFoundError):
            await client(gw, stranger).responses.retrieve(second.id)
        with pytest.raises(openai.NotFoundError):
            await client(gw, stranger).responses.delete(second.id)
    deleted = await sdk.responses.with_raw_response.delete(second.id)
    assert deleted.http_response.json() == {"id": second.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(second.id)
    assert (await sdk.responses.retrieve(first.id)).id == first.id
    unkept = await sdk.responses.create(model="m", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(unkept.id)


async def test_ttl_s_expires_a_response(prism_gateway, prism_fake, prism_clock, store):
    store["responses"]["ttl_s"] = 60
    gw = await start(prism_gateway, prism_fake, store, clock=prism_clock)
    sdk = client(gw)
    served = await sdk.responses.create(model="m", input="Hello")
    prism_clock.advance(59)
    assert (await sdk.responses.retrieve(served.id)).id == served.id
    prism_clock.advance(2)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(served.id)
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.responses.create(model="m", previous_response_id=served.id, input="More?")
    assert info.value.code == "previous_response_not_found"


@pytest.mark.parametrize("store", ["sqlite", "postgres", "redis"], indirect=True)
async def test_another_gateway_of_the_store_goes_on(prism_gateway, prism_fake, store):
    sections = store
    first_gw = await start(prism_gateway, prism_fake, sections)
    served = await client(first_gw).responses.create(model="m", input="Hello")
    await first_gw.stop()  # a restart (SQLite) or a replica (PostgreSQL, Redis) follows on
    other = await start(prism_gateway, prism_fake, sections)
    follow_up = await client(other).responses.create(
        model="m", previous_response_id=served.id, input="Again"
    )
    assert follow_up.output_text == ANSWER
    assert len(prism_fake.requests(LINE)[-1].body["messages"]) == 3


async def test_the_memory_store_keeps_at_most_max_items(prism_gateway, prism_fake):
    sections = {"responses": {"store": "memory", "max_items": 2}}
    gw = await start(prism_gateway, prism_fake, sections)
    sdk = client(gw)
    ids = [(await sdk.responses.create(model="m", input=f"Turn {n}")).id for n in range(3)]
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(ids[0])  # the least recently used went first
    assert [(await sdk.responses.retrieve(i)).id for i in ids[1:]] == ids[1:]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"store": "mongo"}, "store"),
        ({"store": "sqlite"}, "path"),
        ({"store": "postgres"}, "url"),
        ({"store": "memory", "path": "x.sqlite"}, "path"),
        ({"store": "postgres", "url": "mysql://db/x"}, "url"),
        ({"ttl_s": 0}, "ttl_s"),
    ],
)
async def test_a_mistake_stops_start_up_naming_the_key(prism_gateway, prism_fake, section, message):
    from prism_proxy import ConfigError

    with pytest.raises(ConfigError) as info:
        await start(prism_gateway, prism_fake, {"responses": section})
    assert f"[prism:responses] {message}" in str(info.value) or message in str(info.value)


async def test_redis_without_its_link_stops_start_up(prism_gateway, prism_fake):
    from prism_proxy import ConfigError

    with pytest.raises(ConfigError) as info:
        await start(prism_gateway, prism_fake, {"responses": {"store": "redis"}})
    assert "shared-state" in str(info.value) and "prism-redis" in str(info.value)
