"""Where entries live: this process's memory (bounded in bytes), or the fleet's Redis.

A store never fails a call: a Redis that does not answer (or answers late)
is a miss on read and a lost write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import attrs
import cachetools

from prism_proxy import SharedState

__all__ = ["MemoryStore", "RedisStore", "Store"]

log = logging.getLogger("prism.cache")


class Store(Protocol):
    #: The store's clock (seconds): entries are stamped and aged by it.
    now: Callable[[], float]

    async def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, blob: bytes, ttl_s: float) -> None: ...


def _size(item: tuple[float, bytes]) -> int:
    return len(item[1]) + 64 + 64  # the entry, and about what its key and tuple take


@attrs.define(eq=False)
class MemoryStore:
    """Entries in this process, least recently used first out past ``max_bytes``.

    Kept across reloads (``generation.keep``): a reload that leaves a model's
    chain alone keeps its entries reachable.
    """

    max_bytes: int
    now: Callable[[], float]
    _entries: cachetools.LRUCache[str, tuple[float, bytes]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._entries = cachetools.LRUCache(self.max_bytes, getsizeof=_size)

    async def lifecycle(self) -> AsyncIterator[None]:
        yield  # nothing to open: the entries live in memory

    @property
    def bytes_used(self) -> int:
        return int(self._entries.currsize)

    async def get(self, key: str) -> bytes | None:
        return self.get_now(key)

    def get_now(self, key: str) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, blob = found
        if expires <= self.now():
            del self._entries[key]
            return None
        return blob

    def put(self, key: str, blob: bytes, ttl_s: float) -> None:
        if _size((0.0, blob)) > self.max_bytes:
            return
        self._entries[key] = (self.now() + ttl_s, blob)


@attrs.define(eq=False)
class RedisStore:
    """Entries in the fleet's Redis (prism-redis's ``shared-state``), expiring by TTL."""

    link: SharedState
    timeout_s: float
    now: Callable[[], float]
    _writes: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    async def lifecycle(self) -> AsyncIterator[None]:
        yield
        # Writes still in flight finish (each bounded by its timeout) before the link closes.
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _key(self, key: str) -> str:
        return f"{self.link.prefix}:cache:{key}"

    async def get(self, key: str) -> bytes | None:
        client: Any = self.link.connect()
        try:
            with self.link.guard("cache"):
                blob = await asyncio.wait_for(client.get(self._key(key)), self.timeout_s)
        except Exception as exc:  # whatever Redis did, the call goes on as a miss
            log.debug("cache: redis lookup failed (%s): a miss", type(exc).__name__)
            return None
        # prism-redis's client decodes replies (entries are UTF-8 JSON).
        if isinstance(blob, str):
            return blob.encode()
        return blob if isinstance(blob, bytes) else None

    def put(self, key: str, blob: bytes, ttl_s: float) -> None:
        task = asyncio.get_running_loop().create_task(self._put(key, blob, ttl_s))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, key: str, blob: bytes, ttl_s: float) -> None:
        client: Any = self.link.connect()
        try:
            with self.link.guard("cache"):
                await asyncio.wait_for(
                    client.set(self._key(key), blob, px=max(int(ttl_s * 1000), 1)),
                    max(self.timeout_s, 1.0),
                )
        except Exception as exc:  # a lost write is a later miss, nothing more
            log.debug("cache: redis write failed (%s)", type(exc).__name__)
