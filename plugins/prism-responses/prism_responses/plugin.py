"""The prism_proxy entry point ``responses``: the ``response-store`` service, configured.

Without this plugin the core keeps Responses API answers in the process
(an hour, 10 000 of them).  With it ``[prism:responses]`` chooses the
engine (``store = memory|sqlite|postgres|redis``) and the bounds; Redis is
reached through the ``shared-state`` service (prism-redis), never by import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prism_proxy import (
    RESPONSE_STORE,
    SHARED_STATE,
    Generation,
    MemoryResponseStore,
    Offer,
    ResponseStore,
    hookimpl,
    provide,
)

from .pg_store import PostgresResponseStore
from .redis_store import RedisResponseStore
from .settings import SECTION, ResponsesSettings
from .sqlite_store import SqliteResponseStore

__all__ = ["PLUGIN_NAME", "make_store"]

PLUGIN_NAME = "responses"


def make_store(generation: Generation, settings: ResponsesSettings) -> ResponseStore:
    """The store ``settings`` name; kept across reloads while they name the same one."""
    clock, ttl_s = generation.clock, settings.ttl_s
    if settings.store == "sqlite":
        path = settings.path
        assert path is not None  # checked by ResponsesSettings.from_config
        sqlite: SqliteResponseStore = generation.keep(
            ("responses", "sqlite", str(path)), lambda: SqliteResponseStore(path, clock, ttl_s)
        )
        sqlite.ttl_s = ttl_s  # a reload may change it
        return sqlite
    if settings.store == "postgres":
        url = settings.url
        assert url is not None
        postgres: PostgresResponseStore = generation.keep(
            ("responses", "postgres", url), lambda: PostgresResponseStore(url, clock, ttl_s)
        )
        postgres.ttl_s = ttl_s
        return postgres
    if settings.store == "redis":
        link = generation.services.require(SHARED_STATE, by=PLUGIN_NAME)
        return RedisResponseStore(link, clock, ttl_s)
    bounds = (ttl_s, settings.max_items, settings.max_bytes)
    memory: MemoryResponseStore = generation.keep(
        ("responses", "memory", bounds),
        lambda: MemoryResponseStore(
            clock, ttl_s=ttl_s, max_items=settings.max_items, max_bytes=settings.max_bytes
        ),
    )
    return memory


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]]:
    settings = ResponsesSettings.from_config(generation.config)
    return [provide(RESPONSE_STORE, lambda: make_store(generation, settings))]


@hookimpl
def prism_generation(generation: Generation) -> None:
    # Built now, before the generation starts, so that a file or pool it keeps is
    # opened with it (and a missing shared-state link stops start-up, not a call).
    generation.services.get(RESPONSE_STORE)


@hookimpl
def prism_readyz(generation: Generation) -> Mapping[str, object]:
    store = generation.services.get(RESPONSE_STORE)
    if store is None:
        return {}
    return {"responses": {"store": store.engine, "ttl_s": store.ttl_s}}


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: ResponsesSettings}
