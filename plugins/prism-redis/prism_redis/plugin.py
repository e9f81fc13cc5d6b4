"""The prism_proxy entry point ``redis``: share the breaker and line capacity through Redis.

Inactive without ``[prism:redis] url``.  With it, each generation gets the
kept link to Redis, the fleet-wide capacity, and a breaker store offered to
prism-breaker under ``breaker.store`` (hence ``tryfirst``: it must be there
before the breaker looks).
"""

from __future__ import annotations

from collections.abc import Awaitable, Hashable, Mapping

from prism_proxy import STORE_ROLE, BreakerStore, CheckLine, Generation, hookimpl

from .breaker_store import RedisBreakerStore
from .capacity import FleetCapacity
from .check import check_redis
from .connection import SharedRedis
from .settings import RedisSettings

__all__ = ["LINK_NAME", "RedisLink", "StoreOffer", "link_of"]

#: The name each generation's :class:`RedisLink` is registered under.
LINK_NAME = "redis.link"


@hookimpl(tryfirst=True)
def prism_generation(generation: Generation) -> None:
    settings = RedisSettings.from_config(generation.config)
    if settings is None:
        return
    where = (settings.url, settings.key_prefix)
    shared = generation.keep(("redis", *where), lambda: SharedRedis(settings, generation.counters))
    generation.capacity = generation.keep(("redis.capacity", *where), lambda: FleetCapacity(shared))
    generation.register(RedisLink(shared), LINK_NAME)
    generation.register(StoreOffer(shared, ("redis", *where)), STORE_ROLE)


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
