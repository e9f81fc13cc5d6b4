"""Counting against limits: what a call asks for, what it holds, and the gateway's own counters.

Every engine keeps the same three kinds of counter and decides the same way:

- a **window** (rpm, tpm): amounts per second; what the last 60 seconds hold
  plus what the call asks for must not exceed the limit;
- **in flight** (max_parallel): one lease per call, given back when it settles
  (or lost by a dead gateway when its lease runs out);
- a **budget**: what was spent in the period (settled, from the ledger) plus
  what calls in flight reserved (each its worst case) plus this call's
  reservation must not exceed the amount, unless the budget is soft.  A
  budget counter the engine does not hold (a new period, a new budget, an
  engine that came back empty) is rebuilt from the ledger before it is used.

A call is checked against all its limits and, only if it fits every one,
reserved on all of them at once: a refusal reserves nothing.
:class:`LocalCounters` is the per-process engine; prism-limits' fleet engine
does the same in one Redis script.
"""

from __future__ import annotations

import collections
import math
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any

import attrs

from .limits import Kind, Limit

__all__ = ["RECENT_S", "WINDOW_S", "Ask", "Decision", "Held", "LocalCounters", "Reading"]

# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_WINDOW, _PARALLEL, _BUDGET = Kind.WINDOW, Kind.PARALLEL, Kind.BUDGET

#: The sliding window of rpm and tpm.
WINDOW_S = 60
#: How long a settled cost is remembered by request id, for a rebuild whose ledger
#: read may not hold its row yet (far longer than a row takes to commit).
RECENT_S = 60


# The per-call objects below are built for every limited call: attrs' mutable
# classes (plain attribute stores) build several times faster than frozen ones.
@attrs.define
class Ask:
    """One limit's share of a call: ``amount`` requests, tokens, a slot or nano-units."""

    limit: Limit
    #: The counter's name (a budget's includes its period's start).
    counter: str
    amount: int
    #: A budget's period end (POSIX seconds), None for the others and ``total``.
    reset_at: int | None = None
    #: The limit as it applies here (below ``limit.value`` while sharing it out).
    value: int = -1

    @property
    def effective(self) -> int:
        return self.limit.value if self.value < 0 else self.value


#: What remains of one limit after the call (or at the refusal), the seconds until it
#: frees up, and whether the call did not fit it: a plain tuple (several per call).
Reading = tuple[int, float, bool]


@attrs.define
class Decision:
    """The engine's answer: ``refused`` is the index of the first limit the call did not fit."""

    readings: tuple[Reading, ...]
    refused: int | None = None
    #: Budget counters the engine does not hold: rebuild them, then ask again.
    missing: tuple[str, ...] = ()
    #: Gateways the engine saw lately (for sharing limits out if it goes away).
    gateways: int = 1


@attrs.define
class Held:
    """What a call holds until it settles."""

    asks: Sequence[Ask]
    member: str
    #: The second the window amounts were counted in (for the correction at settlement).
    second: int
    #: The engine that holds it (the local one while shared state was away).
    engine: object = None
    #: The indices of the budget asks among ``asks``.
    budgets: tuple[int, ...] = ()
    #: Per budget ask's index, the period its counter was named after (the plan's,
    #: shared: a name that no longer matches the ask's counter is not used).
    periods: Mapping[int, tuple[Any, str]] = attrs.field(factory=dict)


@attrs.define
class _Budget:
    spent: int
    reserved: dict[str, int] = attrs.field(factory=dict)
    #: The sum of ``reserved`` (kept, not summed per call).
    reserved_total: int = 0
    #: The recent calls the ledger read it was rebuilt from counted already.
    counted: Collection[str] = frozenset()


@attrs.define
class _Window:
    """The last 60 seconds' amounts, per second, oldest first, and their running total."""

    seconds: collections.deque[list[int]] = attrs.field(factory=collections.deque)
    total: int = 0

    def used(self, second: int) -> int:
        seconds = self.seconds
        while seconds and seconds[0][0] <= second - WINDOW_S:
            self.total -= seconds.popleft()[1]
        return self.total

    def add(self, second: int, amount: int) -> None:
        seconds = self.seconds
        if seconds and seconds[-1][0] == second:
            seconds[-1][1] += amount
        else:
            seconds.append([second, amount])
        self.total += amount

    def correct(self, second: int, delta: int) -> None:
        """Change what ``second`` holds by ``delta`` (not below 0), while it is in the window."""
        for entry in reversed(self.seconds):
            if entry[0] == second:
                change = max(entry[1] + delta, 0) - entry[1]
                entry[1] += change
                self.total += change
                return
            if entry[0] < second:
                return

    def reset_s(self, now: float) -> float:
        """Seconds until the oldest amount in the window leaves it."""
        return max(self.seconds[0][0] + WINDOW_S - now, 0.0) if self.seconds else 0.0


@attrs.define
class LocalCounters:
    """The engine of one gateway process: exact for that process, shared with nobody."""

    windows: dict[str, _Window] = attrs.field(factory=dict)
    inflight: dict[str, set[str]] = attrs.field(factory=dict)
    budgets: dict[str, _Budget] = attrs.field(factory=dict)
    #: Per budget counter, the costs settled in the last ``RECENT_S`` seconds:
    #: ``(when, request id, cost)``, oldest first.
    recent: dict[str, collections.deque[tuple[float, str, int]]] = attrs.field(factory=dict)

    async def lifecycle(self) -> AsyncIterator[None]:
        yield  # in memory: nothing to open or close

    def admit(self, asks: Sequence[Ask], member: str, now: float) -> Decision:
        second = int(now)
        budgets = self.budgets
        windows = self.windows
        inflight = self.inflight
        missing: list[str] | None = None
        readings: list[Reading] = []
        refused: int | None = None
        # Each limit's counter as found while checking, for the reservation after (the
        # checks and the reservations inline: this runs for every limited call).
        found: list[Any] = []
        index = -1
        for ask in asks:
            index += 1
            limit = ask.limit
            kind = limit.kind
            value = ask.value
            if value < 0:
                value = limit.value
            amount = ask.amount
            if kind is _WINDOW:
                counted = windows.get(ask.counter)
                found.append(counted)
                if counted is None:
                    if amount <= value:
                        readings.append((value - amount, 0.0, False))
                        continue
                    readings.append((value, 0.0, True))
                else:
                    seconds = counted.seconds
                    # Only a window holding an expired second needs the method's trim.
                    if seconds and seconds[0][0] <= second - WINDOW_S:
                        used = counted.used(second)
                    else:
                        used = counted.total
                    reset = seconds[0][0] + WINDOW_S - now if seconds else 0.0
                    if reset < 0.0:
                        reset = 0.0
                    if used + amount <= value:
                        readings.append((value - used - amount, reset, False))
                        continue
                    readings.append((value - used if used < value else 0, reset, True))
            elif kind is _PARALLEL:
                members = inflight.get(ask.counter)
                found.append(members)
                held = 0 if members is None else len(members)
                if held < value:
                    readings.append((value - held - 1, 1.0, False))
                    continue
                readings.append((0, 1.0, True))
            else:
                budget = budgets.get(ask.counter)
                if budget is None:
                    missing = [ask.counter] if missing is None else [*missing, ask.counter]
                    continue
                found.append(budget)
                committed = budget.spent + budget.reserved_total
                reset_at = ask.reset_at
                reset = math.inf if reset_at is None else max(reset_at - now, 0.0)
                if limit.soft or committed + amount <= value:
                    after = committed + amount
                    readings.append((value - after if after < value else 0, reset, False))
                    continue
                readings.append((value - committed if committed < value else 0, reset, True))
            if refused is None:
                refused = index
        if missing is not None:
            return Decision((), missing=tuple(missing))
        if refused is not None:
            return Decision(tuple(readings), refused)
        index = 0
        for counter in found:
            ask = asks[index]
            index += 1
            kind = ask.limit.kind
            if kind is _WINDOW:
                if counter is None:
                    counter = windows.get(ask.counter)
                    if counter is None:
                        counter = windows[ask.counter] = _Window()
                amount = ask.amount
                seconds = counter.seconds
                last = seconds[-1] if seconds else None
                if last is not None and last[0] == second:
                    last[1] += amount
                else:
                    seconds.append([second, amount])
                counter.total += amount
            elif kind is _PARALLEL:
                if counter is None:
                    counter = inflight.get(ask.counter)
                    if counter is None:
                        counter = inflight[ask.counter] = set()
                counter.add(member)
            else:
                amount = ask.amount
                reserved = counter.reserved
                counter.reserved_total += amount - reserved.get(member, 0)
                reserved[member] = amount
        return Decision(tuple(readings))

    def rebuilt(self, counter: str, spent: int, counted: Collection[str], now: float) -> None:
        """A budget counter rebuilt from a ledger read (kept if another rebuild came
        first): its total ``spent``, plus the costs settled here lately of calls the
        read did not count (``counted`` names those it did)."""
        if counter in self.budgets:
            return
        for _, member, cost in self._recent(counter, now):
            if member not in counted:
                spent += cost
        self.budgets[counter] = _Budget(spent, counted=counted)

    def _recent(self, counter: str, now: float) -> collections.deque[tuple[float, str, int]]:
        costs = self.recent.get(counter)
        if costs is None:
            costs = self.recent[counter] = collections.deque()
        while costs and costs[0][0] < now - RECENT_S:
            costs.popleft()
        return costs

    def settle(
        self,
        held: Held,
        tokens: int,
        cost: int,
        spend_counters: Sequence[str],
        now: float,
    ) -> list[int]:
        """Give back what ``held`` reserved and count what was used.

        ``tokens`` replace the window reservations of tpm (in the second they
        were counted in, while it is still in the window); ``cost`` is added
        to the budget counters of the period it settled in
        (``spend_counters``, one per budget ask, in order).  Returns each
        budget's spend after.
        """
        member = held.member
        budgets = self.budgets
        for ask in held.asks:
            limit = ask.limit
            kind = limit.kind
            if kind is _WINDOW:
                if tokens != ask.amount and limit.metric == "tpm":
                    counted = self.windows.get(ask.counter)
                    if counted is not None:
                        counted.correct(held.second, tokens - ask.amount)
            elif kind is _PARALLEL:
                members = self.inflight.get(ask.counter)
                if members is not None:
                    members.discard(member)
            else:
                budget = budgets.get(ask.counter)
                if budget is not None:
                    budget.reserved_total -= budget.reserved.pop(member, 0)
        spent_after: list[int] = []
        for counter in spend_counters:
            if cost:
                costs = self.recent.get(counter)
                if costs is None:
                    costs = self.recent[counter] = collections.deque()
                while costs and costs[0][0] < now - RECENT_S:
                    costs.popleft()
                costs.append((now, member, cost))
            budget = budgets.get(counter)
            if budget is None:
                spent_after.append(-1)  # a new period nobody asked about yet: the ledger has it
                continue
            if member not in budget.counted:
                budget.spent += cost
            spent_after.append(budget.spent)
        return spent_after

    def readings(self, asks: Sequence[Ask], now: float) -> list[int | None]:
        """What each limit holds now (None: a budget nobody counted yet)."""
        found: list[int | None] = []
        for ask in asks:
            kind = ask.limit.kind
            if kind is _WINDOW:
                counted = self.windows.get(ask.counter)
                found.append(0 if counted is None else counted.used(int(now)))
            elif kind is _PARALLEL:
                found.append(len(self.inflight.get(ask.counter, ())))
            else:
                budget = self.budgets.get(ask.counter)
                found.append(None if budget is None else budget.spent + budget.reserved_total)
        return found

    def reserving(self) -> bool:
        """Does a budget hold a reservation (a call admitted here still running)?"""
        return any(budget.reserved for budget in self.budgets.values())

    def forget_budgets(self) -> None:
        """Rebase: every budget counter is rebuilt from the ledger on its next use."""
        self.budgets.clear()
