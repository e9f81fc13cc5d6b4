"""``max_concurrency`` across the fleet: a lease in Redis per upstream call in flight.

Each limited line is a sorted set of leases scored by when they end;
taking a slot is one script run (:data:`~.scripts.TAKE_LEASE`), giving it
back one ``ZREM`` sent in the background.  Leases are renewed every third
of ``lease_s`` while held, so a gateway that dies frees its slots within
``lease_s``.  A call that queues (``queue_ms``) asks again every
:data:`POLL_S`: there is no arrival order across gateways.  While Redis does
not answer, each gateway counts its own calls against the full limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from prism_proxy import Capacity, Slots, background

from .connection import UNREACHABLE, SharedRedis
from .scripts import RENEW_LEASES

__all__ = ["POLL_S", "FleetCapacity", "FleetSlots"]

#: How often a queued call asks the fleet again for a slot.
POLL_S = 0.05


class FleetSlots(Slots):
    """One line's slots, counted in Redis; this gateway's own leases listed in ``held``."""

    def __init__(self, limit: int, key: str, fleet: FleetCapacity) -> None:
        super().__init__(limit)
        self.key = key
        self.fleet = fleet
        #: Leases this gateway holds on the line; None for a slot counted locally
        #: while Redis was unreachable.
        self.held: list[str | None] = []

    async def acquire(self, wait_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_s)
        while True:
            if not self.fleet.shared.healthy:
                if await super().acquire(max(0.0, deadline - loop.time())):
                    self.held.append(None)
                    return True
                return False
            try:
                if await self._lease():
                    return True
            except UNREACHABLE:
                continue  # now degraded: count locally from here
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(POLL_S, left))

    async def _lease(self) -> bool:
        member = self.fleet.member()
        shared = self.fleet.shared
        taken = await shared.take_lease(
            "capacity_lease", self.key, member, limit=self.limit, lease_s=shared.settings.lease_s
        )
        if not taken:
            return False
        self.held.append(member)
        self.in_flight += 1
        return True

    def give_back(self) -> None:
        member = self.held.pop() if self.held else None
        if member is None:
            super().give_back()
            return
        self.in_flight -= 1
        self.fleet.shared.release("capacity_release", self.key, member)


class FleetCapacity(Capacity):
    """Every limited line's fleet-wide slots; kept across generations like the core's."""

    def __init__(self, shared: SharedRedis) -> None:
        super().__init__()
        self.shared = shared
        self._members = itertools.count(1)

    def member(self) -> str:
        return f"{self.shared.me}:{next(self._members)}"

    def new_slots(self, line: str, limit: int) -> Slots:
        return FleetSlots(limit, f"{self.shared.prefix}:capacity:{line}", self)

    async def lifecycle(self) -> AsyncIterator[None]:
        async with background(self._renew, "prism-redis-capacity"):
            yield

    async def _renew(self) -> None:
        lease_ms = int(self.shared.settings.lease_s * 1000)
        while True:
            await asyncio.sleep(self.shared.settings.lease_s / 3)
            if not self.shared.healthy:
                continue
            held = [
                (slots.key, [m for m in slots.held if m is not None])
                for slots in self.slots.values()
                if isinstance(slots, FleetSlots)
            ]
            held = [(key, members) for key, members in held if members]
            if not held:
                continue
            with contextlib.suppress(*UNREACHABLE), self.shared.guard("capacity_renew"):
                async with self.shared.connect().pipeline(transaction=False) as pipe:
                    for key, members in held:
                        pipe.eval(RENEW_LEASES, 1, key, lease_ms, *members)
                    await pipe.execute()
