"""prism-redis: breaker state, trial slots, windows and line capacity shared through Redis."""

from .breaker_store import AUDIT_MAX, RedisBreakerStore
from .capacity import FleetCapacity, FleetSlots
from .connection import SharedRedis
from .plugin import LINK_NAME, RedisLink, link_of
from .settings import RedisSettings

__all__ = [
    "AUDIT_MAX",
    "LINK_NAME",
    "FleetCapacity",
    "FleetSlots",
    "RedisBreakerStore",
    "RedisLink",
    "RedisSettings",
    "SharedRedis",
    "link_of",
]
