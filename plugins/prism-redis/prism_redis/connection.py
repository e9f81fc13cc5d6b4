"""One gateway's link to Redis: the client, whether Redis answers, and change notices.

Kept across generations (one per URL and prefix).  Every command has a
short timeout and no retries: a Redis that does not answer marks the link
degraded at once, callers fall back to local decisions, and a background
task pings until it answers again, gives back the leases asked for as it
stopped answering (they may have landed though their answers were lost),
then tells whoever asked to know (the breaker republishes its state so a
Redis that restarted empty converges).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .scripts import TAKE_LEASE
from .settings import RedisSettings

__all__ = ["UNREACHABLE", "SharedRedis"]

log = logging.getLogger("prism.redis")

#: What a Redis that is down or too slow raises through redis-py.
UNREACHABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)


class SharedRedis:
    """The client, the health flag, the change channel and fire-and-forget writes.

    The ``SHARED_STATE`` service (a :class:`prism_proxy.SharedState`).
    """

    engine = "redis"

    def __init__(
        self, settings: RedisSettings, counters: collections.Counter[str] | None = None
    ) -> None:
        self.settings = settings
        #: The gateway's event counters (``/prism/stats``): outages and returns.
        self.counters: collections.Counter[str] = (
            counters if counters is not None else collections.Counter()
        )
        self.prefix = settings.key_prefix
        #: This process among the fleet: names its window fields and its leases.
        self.me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.channel = f"{self.prefix}:events"
        self.client: aioredis.Redis | None = None
        self.healthy = True
        self.last_error: str | None = None
        #: Times Redis stopped answering, and round trips made (by kind), for /readyz.
        self.outages = 0
        self.round_trips: dict[str, int] = {}
        self._changed: list[Callable[[], None]] = []
        self._back: list[Callable[[], None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        #: Leases asked for as Redis stopped answering: given back once it answers.
        self._unsure: list[tuple[str, str]] = []

    def connect(self) -> aioredis.Redis:
        """The client (made on first use; making it does no I/O)."""
        if self.client is None:
            self.client = self._new_client(timeout=True)
        return self.client

    def _new_client(self, *, timeout: bool) -> aioredis.Redis:
        seconds = self.settings.timeout_ms / 1000
        return aioredis.Redis.from_url(
            self.settings.url,
            decode_responses=True,
            socket_timeout=seconds if timeout else None,
            socket_connect_timeout=seconds,
            # A dead Redis must cost one timeout, not a series of retries.
            retry=Retry(NoBackoff(), 0),
        )

    async def disconnect(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()

    def watch(self, changed: Callable[[], None], back: Callable[[], None]) -> None:
        """``changed`` on every change notice, ``back`` each time Redis answers again."""
        self._changed.append(changed)
        self._back.append(back)

    @contextlib.contextmanager
    def guard(self, kind: str) -> Iterator[None]:
        """Count a round trip of ``kind``; a Redis that does not answer marks us degraded."""
        self.round_trips[kind] = self.round_trips.get(kind, 0) + 1
        try:
            yield
        except UNREACHABLE as exc:
            self.failed(exc)
            raise

    def failed(self, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.last_error = error
        if self.healthy:
            self.healthy = False
            self.outages += 1
            self.counters["redis_outages"] += 1
            log.warning(
                "redis: %s does not answer (%s); serving on local state, deciding locally",
                self.settings.where,
                error,
            )

    async def take_lease(
        self,
        kind: str,
        key: str,
        member: str,
        *,
        limit: int,
        lease_s: float,
        spacing_s: float = 0.0,
    ) -> bool:
        """One of ``limit`` slots under ``key`` for ``member``, leased for ``lease_s`` and
        no sooner than ``spacing_s`` after the last one went (Redis's clock decides)."""
        keys = [key, key + ":next"]
        args: list[str | int] = [member, limit, int(lease_s * 1000), int(spacing_s * 1000)]
        try:
            with self.guard(kind):
                taken = await self.connect().eval(TAKE_LEASE, 2, *keys, *args)
        except UNREACHABLE:
            # It may have landed though its answer was lost: held by nobody, it
            # would keep a slot from the whole fleet for lease_s.
            self._unsure.append((key, member))
            raise
        return bool(taken)

    def release(self, kind: str, key: str, member: str) -> None:
        """Give a lease back, in the background."""
        self.spawn(kind, lambda client: client.zrem(key, member))

    def spawn(self, kind: str, work: Callable[[aioredis.Redis], Awaitable[Any]]) -> None:
        """Run ``work`` in the background (a release nobody waits for); skipped while degraded."""
        if not self.healthy:
            return
        client = self.connect()

        async def run() -> None:
            with contextlib.suppress(*UNREACHABLE), self.guard(kind):
                await work(client)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def report(self) -> dict[str, Any]:
        return {
            "shared_state": "ok" if self.healthy else "degraded",
            "redis": {
                "where": self.settings.where,
                "last_error": self.last_error,
                "outages": self.outages,
                "round_trips": dict(sorted(self.round_trips.items())),
            },
        }

    async def lifecycle(self) -> AsyncIterator[None]:
        client = self.connect()
        try:
            with self.guard("ping"):
                await client.ping()
        except UNREACHABLE:
            pass  # logged by guard; start degraded, the monitor keeps trying
        tasks = [
            asyncio.create_task(self._monitor(), name="prism-redis-monitor"),
            asyncio.create_task(self._listen(), name="prism-redis-listen"),
        ]
        try:
            yield
        finally:
            for task in [*tasks, *self._background]:
                task.cancel()
            for task in [*tasks, *self._background]:
                with contextlib.suppress(asyncio.CancelledError, *UNREACHABLE):
                    await task
            await self.disconnect()

    async def _monitor(self) -> None:
        """While degraded, ping every ``sync_s``; when Redis answers, say so and tell watchers."""
        while True:
            await asyncio.sleep(self.settings.sync_s)
            if self.healthy:
                continue
            try:
                await self.connect().ping()
            except UNREACHABLE as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                continue
            self.healthy = True
            self.counters["redis_recoveries"] += 1
            log.warning("redis: %s answers again; converging", self.settings.where)
            unsure, self._unsure = self._unsure, []
            for key, member in unsure:
                self.release("unsure_lease_release", key, member)
            for back in self._back:
                back()

    async def _listen(self) -> None:
        """Change notices from the other gateways (pub/sub), resubscribing after an outage."""
        while True:
            listener = self._new_client(timeout=False)
            pubsub = listener.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        for changed in self._changed:
                            changed()
            except UNREACHABLE as exc:
                self.failed(exc)
            finally:
                with contextlib.suppress(*UNREACHABLE):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                with contextlib.suppress(*UNREACHABLE):
                    await listener.aclose()
            await asyncio.sleep(self.settings.sync_s)
