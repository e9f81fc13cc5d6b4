"""Responses kept in Redis, through the ``shared-state`` link prism-redis provides.

One key per response, ``<prefix>:responses:<id>``, holding the owner, the
expiry and the document, and expiring with it in Redis (so nothing is left
to purge).  Each round trip runs in the link's guard: an outage marks the
link degraded (``/readyz``) and the call that needed the store gets a 503.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prism_proxy import SharedState, StoredResponse, WallClock

__all__ = ["RedisResponseStore"]


class RedisResponseStore:
    """A :class:`prism_proxy.ResponseStore` on the fleet's shared Redis."""

    engine = "redis"

    def __init__(self, link: SharedState, clock: Callable[[], float], ttl_s: float) -> None:
        self.link = link
        self.ttl_s = ttl_s
        self._wall = WallClock(clock)
        self._base = f"{link.prefix}:responses:"

    def now(self) -> float:
        return self._wall()

    def _key(self, response_id: str) -> str:
        return self._base + response_id

    async def put(self, stored: StoredResponse) -> None:
        ttl_ms = max(1, int((stored.expires_at - self.now()) * 1000))
        value = f"{stored.owner}\n{stored.expires_at!r}\n{stored.to_json().decode()}"
        with self.link.guard("responses_put"):
            await self.link.connect().set(self._key(stored.id), value, px=ttl_ms)

    async def _read(self, response_id: str, owner: str) -> tuple[float, str] | None:
        with self.link.guard("responses_get"):
            value: Any = await self.link.connect().get(self._key(response_id))
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode()
        kept_owner, expires, data = str(value).split("\n", 2)
        expires_at = float(expires)
        # Redis expires the key on its own clock; the gateway's decides as the other stores do.
        if kept_owner != owner or expires_at <= self.now():
            return None
        return expires_at, data

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        found = await self._read(response_id, owner)
        if found is None:
            return None
        return StoredResponse.from_json(response_id, owner, found[0], found[1])

    async def delete(self, response_id: str, owner: str) -> bool:
        if await self._read(response_id, owner) is None:
            return False
        with self.link.guard("responses_delete"):
            removed = await self.link.connect().delete(self._key(response_id))
        return bool(removed)
