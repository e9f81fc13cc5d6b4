"""Where the Responses API's conversation state is kept: the type of the ``response-store`` service.

A response served on ``POST /v1/responses`` with ``store`` left true is kept
as a :class:`StoredResponse`: the Response object the caller got, and every
item of its conversation (what was sent to the line, earlier turns included,
then what the line answered).  ``previous_response_id`` puts those items in
front of the next request's input, so a conversation goes on on any line,
after a failover as well; ``GET``/``DELETE /v1/responses/{id}`` read and
remove one.

Each is owned by whoever made it (:func:`owner_of`: the caller's
organisation, else its key, else ``anonymous``) and a store answers only
that owner: another one is told nothing exists.  Items are the caller's
prompts and answers: a store never logs them; only an id and its owner
may appear in a message.

The core's default, :class:`MemoryResponseStore`, keeps them in this
process (bounded by count, bytes and time): gone on restart, and not seen
by other workers or replicas.  prism-responses keeps them in SQLite,
PostgreSQL or Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

import attrs
import cachetools
import orjson

from .call import Principal

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_TTL_S",
    "MemoryResponseStore",
    "ResponseStore",
    "StoredResponse",
    "WallClock",
    "owner_of",
]

log = logging.getLogger("prism")

#: The core's default: an hour, 10 000 responses, 64 MiB of them.
DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_ITEMS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def owner_of(principal: Principal) -> str:
    """Who may read what ``principal`` stored: its organisation, else its key, else anyone
    anonymous (a gateway without authentication is one tenant)."""
    if principal.org is not None:
        return "org:" + principal.org
    if principal.key_id is not None:
        return "key:" + principal.key_id
    return "anonymous"


@attrs.frozen
class StoredResponse:
    """One kept response: ``response`` as served, ``items`` its whole conversation.

    ``expires_at`` is wall-clock seconds (:class:`WallClock`), comparable
    between the gateways sharing a store.
    """

    id: str
    owner: str
    expires_at: float
    response: dict[str, Any]
    items: list[dict[str, Any]]

    def to_json(self) -> bytes:
        """``response`` and ``items`` as one document (the id, owner and expiry are columns)."""
        return orjson.dumps({"response": self.response, "items": self.items})

    @classmethod
    def from_json(cls, id: str, owner: str, expires_at: float, data: bytes | str) -> StoredResponse:
        document = orjson.loads(data)
        return cls(id, owner, expires_at, document["response"], document["items"])


@runtime_checkable
class ResponseStore(Protocol):
    """Responses kept for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``.

    Every method raises the engine's error when it cannot answer (the
    endpoint turns that into a 503, never a silent miss).  A response whose
    ``expires_at`` has passed is as absent as one never kept.
    """

    #: How long a response is kept, in seconds.
    ttl_s: float
    #: What keeps them, for ``/readyz`` and messages (``memory``, ``sqlite`` …).
    engine: str

    def now(self) -> float:
        """The wall-clock time expiries are counted in (a test's clock moves it)."""
        ...

    async def put(self, stored: StoredResponse) -> None:
        """Keep ``stored`` until its ``expires_at`` (replacing one with its id)."""
        ...

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response ``response_id`` if ``owner`` made it and it has not expired."""
        ...

    async def delete(self, response_id: str, owner: str) -> bool:
        """Remove it; False when ``owner`` has no such response (none, expired, another's)."""
        ...


class WallClock:
    """Wall-clock seconds that advance with the gateway's (monotonic, injectable) clock.

    Expiries kept outside the process must be comparable between gateways
    (wall time), yet a test moves time with its manual clock: the wall time
    when this was made, plus how far the gateway's clock moved since.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._wall0 = time.time()
        self._mono0 = clock()

    def __call__(self) -> float:
        return self._wall0 + (self._clock() - self._mono0)


@attrs.define(eq=False)
class _Kept:
    owner: str
    expires_at: float
    data: bytes


class MemoryResponseStore:
    """The core's default: in this process only (a restart forgets, workers do not share).

    A TTL cache bounded by ``max_items`` responses and ``max_bytes`` of their
    JSON; the least recently used go first when either is reached, and one
    response larger than ``max_bytes`` is not kept at all.
    """

    engine = "memory"

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_items: int = DEFAULT_MAX_ITEMS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self._wall = WallClock(clock)
        self._cache: cachetools.TTLCache[str, _Kept] = cachetools.TTLCache(
            maxsize=max_bytes,
            ttl=ttl_s,
            timer=self._wall,
            getsizeof=lambda kept: len(kept.data),
        )

    def now(self) -> float:
        return self._wall()

    async def lifecycle(self) -> AsyncIterator[None]:
        """Nothing to open or close."""
        yield

    async def put(self, stored: StoredResponse) -> None:
        data = stored.to_json()
        try:
            self._cache[stored.id] = _Kept(stored.owner, stored.expires_at, data)
        except ValueError:
            log.warning(
                "response %s (%s) is larger than the store's max_bytes: not kept",
                stored.id,
                stored.owner,
            )
            return
        while len(self._cache) > self.max_items:
            self._cache.popitem()

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        kept = self._cache.get(response_id)
        if kept is None or kept.owner != owner or kept.expires_at <= self.now():
            return None
        return StoredResponse.from_json(response_id, owner, kept.expires_at, kept.data)

    async def delete(self, response_id: str, owner: str) -> bool:
        kept = self._cache.get(response_id)
        if kept is None or kept.owner != owner:
            return False
        del self._cache[response_id]
        return True


#: The keeper's holder that never lets go (generations are numbered from 1).
_PROCESS = -1


def default_store(generation: Any) -> MemoryResponseStore:
    """The core's store, for as long as the process runs.

    Held by the process rather than by a generation: it is made on a call's
    first use, and a generation that never asked for it must not let the
    one before it take the conversations along when it goes (a reload).
    """
    store: MemoryResponseStore = generation.keeper.take(
        ("prism.responses.memory",), lambda: MemoryResponseStore(generation.clock), _PROCESS
    )
    return store
