"""Capacity per line: upstream calls in flight to it from this gateway, and who waits for one.

A chain line may say ``max_concurrency = 8``: at most that many upstream
calls to it at once (a served stream holds its slot until it ends).  A call
that finds the line full moves to the next line at once, unless the line
says ``queue_ms``: then it waits, in arrival order, for at most that long and
never past what its call budget leaves for an attempt.  The counts are kept
across reloads: calls in flight on an older generation still hold slots.
Counting is per process; a plugin may provide the ``CAPACITY`` service with a
subclass of :class:`Capacity` whose :class:`Slots` count across a fleet.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs

from .catalog import Binding

__all__ = ["Capacity", "Slots"]


@attrs.define(eq=False)
class Slots:
    """One line's slots: a counter and a first-come queue of waiters."""

    limit: int
    in_flight: int = 0
    waiters: collections.deque[asyncio.Future[None]] = attrs.field(factory=collections.deque)

    async def acquire(self, wait_s: float) -> bool:
        """A slot now, or after queueing for at most ``wait_s`` (0: no queueing)."""
        if self.take():
            return True
        return wait_s > 0 and await self.wait(wait_s)

    def take(self) -> bool:
        """A slot now, if one is free (and nobody queued before us)."""
        if self.in_flight < self.limit and not self.waiters:
            self.in_flight += 1
            return True
        return False

    async def wait(self, timeout_s: float) -> bool:
        """Queue for a slot for at most ``timeout_s``; True once one was handed over."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
            return True
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return True  # handed over as the time ran out: it is ours
            self._forget(waiter)
            return False
        except BaseException:
            # The caller left: a slot handed over meanwhile goes on to the next.
            if waiter.done() and not waiter.cancelled():
                self.give_back()
            else:
                self._forget(waiter)
            raise

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)

    def give_back(self) -> None:
        """Release a slot: straight to the first waiter still waiting, else to the pool."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on; in_flight stays
                return
        self.in_flight -= 1


@attrs.define(eq=False)
class Capacity:
    """Every limited line's slots, by line id; kept across generations."""

    slots: dict[str, Slots] = attrs.field(factory=dict)

    def for_line(self, binding: Binding) -> Slots | None:
        limit = binding.options.get("max_concurrency")
        if limit is None:
            return None
        slots = self.slots.get(binding.id)
        if slots is None:
            slots = self.slots[binding.id] = self.new_slots(binding.id, limit)
        else:
            slots.limit = limit  # a reload may change it; calls in flight keep theirs
        return slots

    def new_slots(self, line: str, limit: int) -> Slots:
        """The slots of one line; a subclass counts them somewhere shared."""
        return Slots(limit)

    def report(self, binding: Binding) -> dict[str, Any] | None:
        """``max_concurrency``, ``in_flight`` and ``queued`` for a limited line, else None."""
        slots = self.for_line(binding)
        if slots is None:
            return None
        queued = sum(1 for waiter in slots.waiters if not waiter.done())
        return {"max_concurrency": slots.limit, "in_flight": slots.in_flight, "queued": queued}

    async def lifecycle(self) -> AsyncIterator[None]:
        yield  # nothing to open: counts live in memory
