"""Budget alerts: a budget's spend crossing 50, 80 and 100 % of it (``alert_thresholds``).

Crossings are found at settlement, from what the engine says a budget's
spend is once the call's cost was added: the call crossed threshold T when
``before < T x amount <= after`` (``before`` being ``after`` less the cost).
The engine adds costs one at a time (Redis's ``HINCRBY`` is atomic across
the fleet), so exactly one settlement, on one gateway, sees each crossing.
Each crossing is one WARNING line, one JSON event POSTed to ``alert_url``
when it is set, and the organisation's ``prism_budget_used_ratio`` (set at
every settlement, crossing or not).  Soft and hard budgets alike.

Nothing here delays a call: the log line and the gauge are memory work, and
the event goes into a bounded queue that one background task sends from,
with bounded retries (:class:`Outbox`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from prism_proxy import Telemetry

from .limits import Limit, format_money
from .periods import Window

__all__ = ["RATIO", "BudgetAlerts", "Outbox", "crossed"]

log = logging.getLogger("prism.limits")

#: The gauge of an organisation's most used budget (spent over amount).
RATIO = "prism_budget_used_ratio"
#: Counters whose quiet range is remembered before starting afresh.
_QUIET = 4096
_WHEN = {
    "hour": "this hour",
    "day": "today",
    "week": "this week",
    "month": "this month",
    "total": "in total",
}


def crossed(amount: int, after: int, cost: int, thresholds: Sequence[int]) -> list[int]:
    """The percentages of ``amount`` that adding ``cost`` to reach ``after`` crossed."""
    if amount <= 0 or cost <= 0 or after < 0:
        return []
    before = after - cost
    # In whole nano-units times percent: exact, no float rounding at the boundary.
    return [t for t in thresholds if before * 100 < t * amount <= after * 100]


def where(url: str) -> str:
    """``scheme://host:port`` of ``url``: enough to name it in a log line, and nothing a
    webhook URL may carry as a credential (user, password, a token in its path or query)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = f":{parts.port}" if parts.port is not None else ""
        return f"{parts.scheme}://{parts.hostname}{port}"
    except ValueError:
        return "alert_url"


class Outbox:
    """Alert events on their way out: a bounded queue and one sender task at a time.

    :meth:`put` never waits: a full queue drops the event (counted, and said
    once).  The sender starts when an event arrives and ends when the queue
    is empty, so nothing runs while there is nothing to send.  Each event is
    tried ``attempts`` times, waiting ``backoff_s``, then twice that, ...
    between tries; a receiver that fails is logged once until it takes an
    event again.
    """

    def __init__(
        self,
        *,
        capacity: int = 1000,
        attempts: int = 4,
        backoff_s: float = 0.5,
        timeout_s: float = 5.0,
        grace_s: float = 2.0,
    ) -> None:
        self.capacity = capacity
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.sent = 0
        self.dropped = 0
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        #: Failing since the first failure, until the next event taken: logged once.
        self._failing = False
        self._dropped_while_failing = 0

    async def lifecycle(self) -> AsyncIterator[None]:
        """For a caller that keeps it: on the way out, a short grace to send what is queued."""
        try:
            yield
        finally:
            task = self._task
            if task is not None and not task.done():
                await asyncio.wait({task}, timeout=self.grace_s)
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def put(self, url: str, event: Mapping[str, Any]) -> None:
        """Queue ``event`` for ``url`` (called on the event loop; never waits)."""
        if len(self._queue) >= self.capacity:
            self._dropped(url, f"{self.capacity} alerts are already waiting")
            return
        self._queue.append((url, json.dumps(event).encode()))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._send_all(), name="prism-limits-alerts"
            )

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def drained(self) -> None:
        """Return once every queued event was sent or given up on (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def _send_all(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while self._queue:
                url, body = self._queue.popleft()
                try:
                    await self._send(session, url, body)
                except Exception as exc:  # the sender must outlive any one event
                    self._dropped(url, f"it could not be sent ({type(exc).__name__})")

    async def _send(self, session: aiohttp.ClientSession, url: str, body: bytes) -> None:
        headers = {"Content-Type": "application/json"}
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with session.post(
                    url, data=body, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self._failed(url, type(exc).__name__)
                continue
            if 200 <= status < 300:
                self.sent += 1
                if self._failing:
                    log.warning(
                        "limits: budget alerts reach %s again (%d dropped meanwhile)",
                        where(url),
                        self._dropped_while_failing,
                    )
                    self._failing = False
                    self._dropped_while_failing = 0
                return
            self._failed(url, f"HTTP {status}")
            if status < 500 and status not in (408, 429):
                break  # the receiver refused this event: sending it again changes nothing
        self._dropped(url, "its receiver did not take it")

    def _failed(self, url: str, why: str) -> None:
        if not self._failing:
            self._failing = True
            log.warning(
                "limits: %s did not take a budget alert (%s); retrying, and not saying so "
                "again until it takes one",
                where(url),
                why,
            )

    def _dropped(self, url: str, why: str) -> None:
        self.dropped += 1
        self._dropped_while_failing += 1
        if not self._failing:
            self._failing = True
            log.warning(
                "limits: a budget alert for %s was dropped: %s (not saying so again until "
                "one is sent)",
                where(url),
                why,
            )


class BudgetAlerts:
    """One generation's thresholds, gauge and destination; the outbox may outlive it."""

    def __init__(
        self,
        thresholds: Sequence[int],
        url: str | None,
        outbox: Outbox,
        telemetry: Telemetry,
        *,
        currency: str | None = None,
        wall: Callable[[], float],
    ) -> None:
        self.thresholds = tuple(thresholds)
        self.url = url
        self.outbox = outbox
        self.telemetry = telemetry
        self.currency = currency
        self.wall = wall
        #: Organisation -> its budgets' counters -> (spent over amount, period end).
        self._used: dict[str, dict[str, tuple[float, int | None]]] = {}
        #: The ratio last exported per organisation.
        self._exported: dict[str, float] = {}
        #: Each counter's ratio when the gauge was last worked out from it.
        self._looked: dict[str, float] = {}
        #: Per counter, the spend range ``[low, high)`` in which a settlement changes
        #: nothing: no threshold crossed, the gauge not looked at again (most of them).
        self._quiet: dict[str, tuple[int, int]] = {}

    def settled(
        self,
        org: str | None,
        key_id: str | None,
        budgets: Sequence[tuple[Limit, Window, str]],
        spent_after: Sequence[int],
        cost: int,
    ) -> None:
        """A call's cost was added to ``budgets`` (each with its period and counter);
        ``spent_after`` is what each holds now (-1: a counter the engine does not hold)."""
        orgs: list[str] | None = None
        quiet = self._quiet
        for (limit, span, counter), after in zip(budgets, spent_after, strict=False):
            calm = quiet.get(counter)
            if calm is not None and calm[0] <= after < calm[1]:
                continue
            value = limit.value
            if after < 0 or value <= 0:
                continue
            # A threshold is crossed only where the whole percentage changed.
            if cost > 0 and after * 100 // value != (after - cost) * 100 // value:
                for threshold in crossed(value, after, cost, self.thresholds):
                    self._alert(org, key_id, limit, span, after, threshold)
            if limit.owner.scope == "organisation":
                # The gauge is the organisation's own budgets' (a key's has its alerts).
                name = limit.owner.name
                used = self._used.get(name)
                if used is None:
                    used = self._used[name] = {}
                ratio = after / value
                was = used.get(counter)
                used[counter] = (ratio, span.end)
                # Looked at again when it moved a thousandth since the last look: not
                # once per call for a budget a call moves by far less.
                looked = self._looked.get(counter, -1.0)
                if was is None or abs(ratio - looked) >= 0.001:
                    looked = self._looked[counter] = ratio
                    orgs = [name] if orgs is None else [*orgs, name]
                # The gauge's next look (rounded down: a look a nano-unit early is harmless).
                high = min(self._next(value, after), int((looked + 0.001) * value))
            else:
                high = self._next(value, after)
            if len(quiet) >= _QUIET:
                quiet.clear()
            quiet[counter] = (after, high)
        if orgs is not None:
            for name in orgs:
                self._gauge(name)

    def _next(self, value: int, spent: int) -> int:
        """The least spend at which a threshold above ``spent`` is reached."""
        # The least ``after`` with ``after * 100 >= threshold * value``, of the thresholds
        # above ``spent`` (in whatever order the operator wrote them).
        return min(
            (-(-t * value // 100) for t in self.thresholds if t * value > spent * 100),
            default=1 << 62,
        )

    def _gauge(self, org: str) -> None:
        """The organisation's most used budget in its current periods."""
        used = self._used.get(org)
        if not used:
            return
        now = self.wall()
        for counter in [c for c, (_, end) in used.items() if end is not None and end <= now]:
            del used[counter]  # a period that ended: its successor counts afresh
            self._looked.pop(counter, None)
            self._quiet.pop(counter, None)
        ratio = max((ratio for ratio, _ in used.values()), default=0.0)
        # Exported when it moved by a thousandth or more: not once per call for a
        # budget a call moves by far less.
        last = self._exported.get(org)
        if last is None or abs(ratio - last) >= 0.001:
            self._exported[org] = ratio
            self.telemetry.set(RATIO, ratio, org=org)

    def _alert(
        self,
        org: str | None,
        key_id: str | None,
        limit: Limit,
        span: Window,
        spent: int,
        threshold: int,
    ) -> None:
        assert limit.period is not None
        mode = "soft" if limit.soft else "hard"
        currency = f" {self.currency}" if self.currency else ""
        # Names and amounts only: no prompt, no key secret (a key id is not one).
        log.warning(
            "limits: %s crossed %d%%: %s%s spent %s (%s budget; the call was key %s's)",
            limit.describe(),
            threshold,
            format_money(spent),
            currency,
            _WHEN[limit.period.value],
            mode,
            key_id or "none",
        )
        if self.url is None:
            return
        event: dict[str, Any] = {
            "type": "budget_threshold",
            "organisation": org,
            "key_id": key_id,
            "scope": limit.owner.scope,
            "owner": limit.owner.name,
            "limit": limit.setting,
            "model": limit.model,
            "budget": format_money(limit.value),
            "period": limit.period.value,
            "period_start": span.start if span.end is not None else None,
            "resets_at": span.end,
            "mode": mode,
            "spent": format_money(spent),
            "threshold": threshold,
            "currency": self.currency,
            "at": round(self.wall(), 3),
        }
        self.outbox.put(self.url, event)
