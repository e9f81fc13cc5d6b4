"""``prism check``: is state shared, and does Redis answer (a PING: nothing written)?"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from prism_proxy import CheckLine

from .settings import SECTION, RedisSettings

__all__ = ["check_redis"]

SUBJECT = "shared state"
#: Seconds to wait for Redis: more than a gateway's per-command timeout, since a
#: check that calls a Redis down which is merely slow to connect would mislead.
TIMEOUT_S = 5.0


async def check_redis(settings: RedisSettings | None, offline: bool) -> list[CheckLine]:
    if settings is None:
        return [
            CheckLine(
                SUBJECT,
                f"off: no [prism:{SECTION}] section; each gateway keeps its own breaker state "
                "and line capacity",
            )
        ]
    what = f"on, Redis {settings.where}"
    if offline:
        return [CheckLine(SUBJECT, f"{what}: not contacted (--offline)")]
    client = aioredis.Redis.from_url(
        settings.url,
        socket_timeout=TIMEOUT_S,
        socket_connect_timeout=TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        await client.ping()
    except (RedisError, OSError, TimeoutError) as exc:
        return [CheckLine.unreachable(SUBJECT, what, exc, settings.url)]
    finally:
        await client.aclose()
    return [CheckLine(SUBJECT, f"{what}: reachable")]
