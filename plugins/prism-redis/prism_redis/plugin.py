"""The prism_proxy entry point ``redis``: share the breaker and line capacity through Redis.

Inactive without ``[prism:redis] url``.  With it, each generation is offered
three services on the kept link to Redis: ``SHARED_STATE`` (the link),
``CAPACITY`` (slots counted fleet-wide) and ``BREAKER_STORE``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Hashable, Mapping
from typing import Any

from prism_proxy import (
    BREAKER_STORE,
    CAPACITY,
    SHARED_STATE,
    BreakerStore,
    CheckLine,
    Generation,
    Offer,
    hookimpl,
    provide,
)

from .breaker_store import RedisBreakerStore
from .capacity import FleetCapacity
from .check import check_redis
from .connection import SharedRedis
from .settings import SECTION, RedisSettings

__all__ = ["LINK_NAME", "RedisLink", "StoreOffer", "link_of"]

#: The name each generation's :class:`RedisLink` is registered under.
LINK_NAME = "redis.link"


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]] | None:
    settings = RedisSettings.from_config(generation.config)
    if settings is None:
        return None
    where = (settings.url, settings.key_prefix)

    def shared() -> SharedRedis:
        return generation.keep(
            ("redis", *where), lambda: SharedRedis(settings, generation.counters)
        )

    return [
        provide(SHARED_STATE, shared),
        provide(
            CAPACITY,
            lambda: generation.keep(("redis.capacity", *where), lambda: FleetCapacity(shared())),
        ),
        provide(BREAKER_STORE, lambda: StoreOffer(shared(), ("redis", *where))),
    ]


@hookimpl
def prism_generation(generation: Generation) -> None:
    shared = generation.services.get(SHARED_STATE)
    if not isinstance(shared, SharedRedis):
        return  # inactive, or the operator chose another engine's link
    # What /readyz says of the link.  Looking it up by name is how plugins found the
    # link before services; kept for one release.
    generation.register(
        RedisLink(shared),
        LINK_NAME,
        deprecated="use generation.services.get(prism_proxy.SHARED_STATE)",
    )


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: RedisSettings}


@hookimpl
def prism_check(generation: Generation, offline: bool) -> Awaitable[list[CheckLine]]:
    return check_redis(RedisSettings.from_config(generation.config), offline)


class StoreOffer:
    """The breaker's store on this link (a :class:`prism_proxy.StoreProvider`)."""

    def __init__(self, shared: SharedRedis, store_key: Hashable) -> None:
        self.shared = shared
        self.store_key = store_key

    def breaker_store(self, settings: object) -> BreakerStore:
        return RedisBreakerStore(self.shared)


class RedisLink:
    """One generation's view of the shared link: what ``/readyz`` says of it."""

    def __init__(self, shared: SharedRedis) -> None:
        self.shared = shared

    @hookimpl
    def prism_readyz(self, generation: Generation) -> Mapping[str, object]:
        return self.shared.report()


def link_of(generation: Generation) -> RedisLink | None:
    link = generation.plugin(LINK_NAME)
    return link if isinstance(link, RedisLink) else None
