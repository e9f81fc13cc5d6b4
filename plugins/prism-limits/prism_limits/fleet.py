"""The fleet's counters in Redis: every limit of a call checked and reserved in one script.

The scripts do what :class:`prism_limits.counting.LocalCounters` does, on
keys every gateway shares, with Redis's clock: a call's limits cost one round
trip at admission whatever their number, and one (not awaited by the caller)
at settlement.  Amounts travel as integer strings and are written with
``HINCRBY``, so money stays exact (Lua compares them as doubles, exact below
2^53 nano-units: nine million currency units, above the largest budget).

Keys, under the shared prefix: ``limits:<counter>`` (a window's per-second
amounts, the in-flight leases, or a budget's ``spent``, ``reserved`` and one
``r:<call>`` field per reservation), ``limits:<counter>:leases`` (when each
budget reservation expires), ``limits:budget-counters`` (the budget counters
rebuilt from the ledger, scored by when they expire: what a rebase drops) and
``limits:gateways`` (who admitted lately).

A budget's ``spent`` is rebuilt from the ledger (the truth) whenever the
fleet does not hold it.  A *rebase* drops every ``spent`` so that each is
rebuilt on its next use: at each gateway's start (a gateway that stopped
may have settled calls the ledger has and Redis never got), when Redis
answers again after an outage (what was settled meanwhile is in the ledger,
not in Redis), and on demand (``prism limits rebase``).  Reservations of
calls in flight are kept: they are given back at settlement as always.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import Any

import attrs

from prism_proxy import SharedState

from .counting import Ask, Decision, Held, LocalCounters, Reading
from .limits import Kind

__all__ = ["SEEN_MS", "WATCH_S", "FleetCounters", "Standing"]

log = logging.getLogger("prism.limits")

#: A gateway that admitted nothing for this long no longer counts in the fleet.
SEEN_MS = 30_000
#: How often a gateway looks whether shared state went away or came back (a flag in
#: memory: cheap), so that it rebases soon after Redis answers again.
WATCH_S = 0.1
#: Admissions whose answer was lost, given back when Redis answers again: at most this many.
_UNSURE_MAX = 10_000

ADMIT = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, lease, me, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local gw = KEYS[2 * n + 1]
redis.call('ZADD', gw, now, me)
redis.call('ZREMRANGEBYSCORE', gw, '-inf', now - tonumber(ARGV[5]))
redis.call('PEXPIRE', gw, 2 * tonumber(ARGV[5]))
local gateways = redis.call('ZCARD', gw)
local missing = {}
for i = 1, n do
  local a = 5 + (i - 1) * 5
  if ARGV[a + 1] == 'b' and redis.call('HEXISTS', KEYS[2 * i - 1], 'spent') == 0 then
    missing[#missing + 1] = i
  end
end
if #missing > 0 then
  return {2, gateways, missing}
end
local readings = {}
local refused = 0
for i = 1, n do
  local a = 5 + (i - 1) * 5
  local kind, value, amount = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local soft = ARGV[a + 4] == '1'
  local key, aux = KEYS[2 * i - 1], KEYS[2 * i]
  local fits, remaining, reset
  if kind == 'w' then
    local all = redis.call('HGETALL', key)
    local used, oldest = 0, nil
    for j = 1, #all, 2 do
      local at = tonumber(all[j])
      if at <= sec - 60 then
        redis.call('HDEL', key, all[j])
      else
        used = used + tonumber(all[j + 1])
        if oldest == nil or at < oldest then oldest = at end
      end
    end
    fits = used + amount <= value
    if fits then used = used + amount end
    remaining = value - used
    if oldest == nil then reset = 0 else reset = (oldest + 60) * 1000 - now end
  elseif kind == 'p' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    local held = redis.call('ZCARD', key)
    fits = held + 1 <= value
    if fits then held = held + 1 end
    remaining = value - held
    reset = 1000
  else
    local held = tonumber(redis.call('HGET', key, 'reserved') or '0')
    if held ~= 0 and redis.call('EXISTS', aux) == 0 then
      -- The leases' key outlives every lease in it: gone, every reservation ran out
      -- (a gateway died holding them, and nobody admitted since to find them expired).
      for _, field in ipairs(redis.call('HKEYS', key)) do
        if string.sub(field, 1, 2) == 'r:' then redis.call('HDEL', key, field) end
      end
      redis.call('HSET', key, 'reserved', '0')
    end
    local expired = redis.call('ZRANGEBYSCORE', aux, '-inf', now)
    for _, gone in ipairs(expired) do
      local r = redis.call('HGET', key, 'r:' .. gone)
      if r then
        redis.call('HINCRBY', key, 'reserved', '-' .. r)
        redis.call('HDEL', key, 'r:' .. gone)
      end
    end
    if #expired > 0 then redis.call('ZREMRANGEBYSCORE', aux, '-inf', now) end
    local committed = tonumber(redis.call('HGET', key, 'spent')) +
      tonumber(redis.call('HGET', key, 'reserved') or '0')
    fits = soft or committed + amount <= value
    if fits then committed = committed + amount end
    remaining = value - committed
    reset = tonumber(ARGV[a + 5])
    if reset > 0 then reset = reset * 1000 - now else reset = -1 end
  end
  if remaining < 0 then remaining = 0 end
  readings[#readings + 1] = remaining
  readings[#readings + 1] = reset
  if not fits and refused == 0 then refused = i end
end
if refused > 0 then
  return {1, gateways, readings, refused}
end
for i = 1, n do
  local a = 5 + (i - 1) * 5
  local kind, amount = ARGV[a + 1], ARGV[a + 3]
  local key, aux = KEYS[2 * i - 1], KEYS[2 * i]
  if kind == 'w' then
    redis.call('HINCRBY', key, sec, amount)
    redis.call('PEXPIRE', key, 61000)
  elseif kind == 'p' then
    redis.call('ZADD', key, now + lease, member)
    redis.call('PEXPIRE', key, 2 * lease)
  else
    redis.call('HINCRBY', key, 'reserved', amount)
    redis.call('HSET', key, 'r:' .. member, amount)
    redis.call('ZADD', aux, now + lease, member)
    redis.call('PEXPIRE', aux, 2 * lease)
  end
end
return {0, gateways, readings, sec}
"""

SETTLE = """
local member, second, cost = ARGV[1], ARGV[2], ARGV[4]
local tokens, n = tonumber(ARGV[3]), tonumber(ARGV[5])
for i = 1, n do
  local a = 5 + (i - 1) * 2
  local kind, amount = ARGV[a + 1], tonumber(ARGV[a + 2])
  local key, aux = KEYS[2 * i - 1], KEYS[2 * i]
  if kind == 't' then
    if tokens ~= amount and redis.call('HEXISTS', key, second) == 1 then
      local now = tonumber(redis.call('HGET', key, second))
      local after = now + tokens - amount
      if after < 0 then after = 0 end
      redis.call('HSET', key, second, string.format('%d', after))
    end
  elseif kind == 'p' then
    redis.call('ZREM', key, member)
  elseif kind == 'b' then
    local r = redis.call('HGET', key, 'r:' .. member)
    if r then
      redis.call('HINCRBY', key, 'reserved', '-' .. r)
      redis.call('HDEL', key, 'r:' .. member)
      redis.call('ZREM', aux, member)
    end
  end
end
local spent = {}
for i = 2 * n + 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], 'spent') == 1 then
    spent[#spent + 1] = redis.call('HINCRBY', KEYS[i], 'spent', cost)
  else
    spent[#spent + 1] = -1
  end
end
return spent
"""

REBUILT = """
if redis.call('HSETNX', KEYS[1], 'spent', ARGV[1]) == 1 then
  local expire = tonumber(ARGV[2])
  local t = redis.call('TIME')
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. t[1])
  if expire > 0 then
    redis.call('EXPIREAT', KEYS[1], expire)
    redis.call('ZADD', KEYS[2], expire, KEYS[1])
  else
    redis.call('ZADD', KEYS[2], '+inf', KEYS[1])
  end
end
return 1
"""

RENEW = """
local t = redis.call('TIME')
local lease = tonumber(ARGV[1])
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', until_ms, ARGV[i + 1])
  -- A call longer than the key's life (set at the last admission) must keep it.
  redis.call('PEXPIRE', KEYS[i], 2 * lease)
end
return #KEYS
"""

REBASE = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. t[1])
local keys = redis.call('ZRANGE', KEYS[1], 0, -1)
local dropped = 0
for _, key in ipairs(keys) do
  dropped = dropped + redis.call('HDEL', key, 'spent')
end
redis.call('DEL', KEYS[1])
return dropped
"""

LOOK = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local out = {sec, redis.call('ZCOUNT', KEYS[2 * n + 1], now - tonumber(ARGV[2]), '+inf')}
for i = 1, n do
  local kind, key, aux = ARGV[2 + i], KEYS[2 * i - 1], KEYS[2 * i]
  local used, extra = 0, -1
  if kind == 'w' then
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      local at = tonumber(all[j])
      if at > sec - 60 then
        used = used + tonumber(all[j + 1])
        if extra < 0 or at < extra then extra = at end
      end
    end
  elseif kind == 'p' then
    used = redis.call('ZCOUNT', key, '(' .. now, '+inf')
  else
    local spent = redis.call('HGET', key, 'spent')
    if spent then used = tonumber(spent) else used = -1 end
    extra = 0
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', aux, '(' .. now, '+inf')) do
      extra = extra + tonumber(redis.call('HGET', key, 'r:' .. member) or '0')
    end
  end
  out[#out + 1] = used
  out[#out + 1] = extra
end
return out
"""

_KIND_CODES = {Kind.WINDOW: "w", Kind.PARALLEL: "p", Kind.BUDGET: "b"}
#: A budget counter outlives its period by a day (a late settlement still finds it).
_GRACE_S = 86_400


@attrs.frozen
class Standing:
    """What one limit's counter holds now in the fleet's counters."""

    #: Requests or tokens in the last 60 seconds, calls in flight, or a budget's
    #: settled spend (None: a budget counter the fleet does not hold: the ledger has it).
    used: int | None
    #: A budget's reservations by calls in flight (nano-units), not in ``used``.
    reserved: int = 0
    #: A window's seconds until its oldest amount leaves it (None: nothing in it).
    frees_in_s: float | None = None


class FleetCounters:
    """The counters every gateway sharing ``link`` (Redis) counts in.

    ``local`` is this process's own engine, which the limiter counts in while
    Redis does not answer: its budget counters are forgotten once Redis
    answers again (they would miss what the fleet spends until the next
    outage), after the calls it admitted meanwhile have settled.
    """

    def __init__(
        self, link: SharedState, lease_s: float, local: LocalCounters | None = None
    ) -> None:
        self.link = link
        self.lease_s = lease_s
        self.local = local
        self.base = f"{link.prefix}:limits:"
        #: This gateway's calls holding leases, by call: renewed while they run.
        self.held: dict[str, Held] = {}
        #: Shared state went away since the last rebase: rebase when it answers again.
        self.lost = False
        #: Times this gateway rebased because shared state answered again (tests, logs).
        self.returns = 0
        #: Admissions sent as Redis stopped answering: they may have landed though their
        #: answer was lost, holding a slot and a reservation for nobody; given back on return.
        self.unsure: list[Held] = []
        #: Calls admitted locally during the outage were still in flight at the return:
        #: rebase again once they settled (their cost reaches the ledger, not Redis).
        self.settling = False
        self._background: set[asyncio.Task[None]] = set()

    @property
    def lease_s(self) -> float:
        return self._lease_s

    @lease_s.setter
    def lease_s(self, value: float) -> None:
        # Each generation sets it: a reload may change it for the counters it keeps.
        self._lease_s = value
        self.lease_ms = int(value * 1000)

    async def lifecycle(self) -> AsyncIterator[None]:
        await self._rebase_at_start()
        renewal = asyncio.ensure_future(self._renew_forever())
        watch = asyncio.ensure_future(self._watch_forever())
        try:
            yield
        finally:
            for task in (renewal, watch):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.settled()

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` (a settlement nobody waits for) until it ends, shutdown included."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settled(self) -> None:
        """Wait for the settlements written so far (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def usable(self) -> bool:
        """Does shared state answer?  A False answer is remembered: rebase on its return."""
        if self.link.healthy:
            return True
        self.lost = True
        return False

    # -- outages -------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self, kind: str) -> Iterator[None]:
        """The link's guard; a round trip that found Redis away marks an outage."""
        try:
            with self.link.guard(kind):
                yield
        except BaseException:
            if not self.link.healthy:
                self.lost = True
            raise

    async def _rebase_at_start(self) -> None:
        # A gateway of the fleet that stopped may have settled calls whose cost reached
        # the ledger and never Redis: whoever starts rebuilds every budget from the ledger.
        try:
            dropped = await self.rebase()
        except Exception as exc:
            self.lost = True  # not now: as soon as Redis answers
            log.info("limits: no rebase at start, shared state did not answer (%s)", _name(exc))
            return
        log.info(
            "limits: rebased at start: %d budget counters in shared state are rebuilt from "
            "the ledger on their next use",
            dropped,
        )

    async def _watch_forever(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                await self.watch()
            except Exception:  # never the end of the watch: the next look tries again
                log.exception("limits: looking at shared state failed")

    async def watch(self) -> None:
        """One look at the link: rebase once shared state answers again after an outage."""
        if not self.usable():
            return
        if self.lost:
            await self._returned()
        elif self.settling and not _reserving(self.local):
            # The calls admitted locally during the outage have settled; the ledger has
            # their cost, which the rebase at the return could not see yet.
            self.settling = False
            if await self._rebase_after_outage("the calls admitted during the outage settled"):
                self._forget_local()

    async def _returned(self) -> None:
        self.lost = False
        unsure, self.unsure = self.unsure, []
        try:
            for held in unsure:
                # No window amount to correct (second 0 is never a window's field): this
                # gives back a slot and a reservation that may have landed for nobody.
                await self.settle(held, 0, 0, ())
        except Exception as exc:
            if self.lost:  # gone again: all of them at its next return
                self.unsure = unsure + self.unsure
                return
            # Redis answers but refused: their leases run out by themselves.
            log.debug("limits: could not give back unsure admissions (%s)", _name(exc))
        pending = _reserving(self.local)
        if not await self._rebase_after_outage("shared state answers again"):
            return
        self.returns += 1
        if pending:
            self.settling = True
        else:
            self._forget_local()

    async def _rebase_after_outage(self, why: str) -> bool:
        try:
            dropped = await self.rebase()
        except Exception as exc:
            if self.link.healthy:
                # Redis answers but refused the script: retrying every tick would not help.
                log.warning("limits: rebase after an outage failed (%s)", _name(exc))
            return False
        log.warning(
            "limits: %s: %d budget counters in shared state are rebuilt from the ledger on "
            "their next use (what was settled during the outage is in the ledger, not in Redis)",
            why,
            dropped,
        )
        return True

    def _forget_local(self) -> None:
        if self.local is not None:
            self.local.forget_budgets()

    # -- the counters --------------------------------------------------------

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self.held and self.link.healthy:
                try:
                    await self.renew(list(self.held.values()))
                except Exception as exc:
                    log.debug("limits: renewal failed (%s)", _name(exc))

    def key(self, counter: str) -> str:
        return self.base + counter

    async def admit(self, asks: Sequence[Ask], member: str) -> tuple[Decision, int]:
        """The decision, and the second (Redis's clock) the window amounts went in."""
        keys: list[str] = []
        args: list[str | int] = [member, self.lease_ms, self.link.me, len(asks), SEEN_MS]
        for ask in asks:
            key = self.key(ask.counter)
            keys += (key, key + ":leases")
            args += (
                _KIND_CODES[ask.limit.kind],
                ask.effective,
                ask.amount,
                int(ask.limit.soft),
                ask.reset_at or 0,
            )
        keys.append(self.base + "gateways")
        try:
            with self._guard("limits_admit"):
                answer: list[Any] = await self.link.connect().eval(ADMIT, len(keys), *keys, *args)
        except Exception:
            if not self.link.healthy and len(self.unsure) < _UNSURE_MAX:
                self.unsure.append(Held(list(asks), member, 0, self))
            raise
        status, gateways = int(answer[0]), int(answer[1])
        if status == 2:
            missing = tuple(asks[int(index) - 1].counter for index in answer[2])
            return Decision((), missing=missing, gateways=gateways), 0
        raw = answer[2]
        readings = tuple(
            Reading(int(raw[i]), _seconds(int(raw[i + 1]))) for i in range(0, len(raw), 2)
        )
        if status == 1:
            return Decision(readings, refused=int(answer[3]) - 1, gateways=gateways), 0
        return Decision(readings, gateways=gateways), int(answer[3])

    async def rebuilt(self, counter: str, spent: int, reset_at: int | None) -> None:
        """Set a budget counter from the ledger, unless another gateway did first."""
        keys = [self.key(counter), self.base + "budget-counters"]
        expire = 0 if reset_at is None else reset_at + _GRACE_S
        with self._guard("limits_rebuild"):
            await self.link.connect().eval(REBUILT, 2, *keys, spent, expire)

    async def settle(
        self, held: Held, tokens: int, cost: int, spend_counters: Sequence[str]
    ) -> list[int]:
        keys: list[str] = []
        args: list[str | int] = [held.member, held.second, tokens, cost, len(held.asks)]
        for ask in held.asks:
            key = self.key(ask.counter)
            keys += (key, key + ":leases")
            code = _KIND_CODES[ask.limit.kind]
            if code == "w":
                code = "t" if ask.limit.metric == "tpm" else "r"
            args += (code, ask.amount)
        keys += [self.key(counter) for counter in spend_counters]
        with self._guard("limits_settle"):
            spent: list[Any] = await self.link.connect().eval(SETTLE, len(keys), *keys, *args)
        return [int(value) for value in spent]

    async def renew(self, held: Sequence[Held]) -> None:
        """Keep the leases of calls still in flight (a dead gateway's run out)."""
        keys: list[str] = []
        members: list[str] = []
        for call in held:
            for ask in call.asks:
                kind = ask.limit.kind
                if kind is Kind.PARALLEL:
                    keys.append(self.key(ask.counter))
                elif kind is Kind.BUDGET:
                    keys.append(self.key(ask.counter) + ":leases")
                else:
                    continue
                members.append(call.member)
        if keys:
            with self._guard("limits_renew"):
                await self.link.connect().eval(RENEW, len(keys), *keys, self.lease_ms, *members)

    async def rebase(self) -> int:
        """Drop every budget counter's spend: each is rebuilt from the ledger on its next
        use.  Returns how many were dropped."""
        with self._guard("limits_rebase"):
            count: int = await self.link.connect().eval(REBASE, 1, self.base + "budget-counters")
        return int(count)

    async def standing(self, asks: Sequence[Ask]) -> tuple[list[Standing], int]:
        """What each limit's counter holds now, and how many gateways admitted lately
        (one read-only round trip)."""
        keys: list[str] = []
        args: list[str | int] = [len(asks), SEEN_MS]
        for ask in asks:
            key = self.key(ask.counter)
            keys += (key, key + ":leases")
            args.append(_KIND_CODES[ask.limit.kind])
        keys.append(self.base + "gateways")
        with self._guard("limits_read"):
            raw: list[Any] = await self.link.connect().eval(LOOK, len(keys), *keys, *args)
        second, gateways = int(raw[0]), int(raw[1])
        found: list[Standing] = []
        for index, ask in enumerate(asks):
            used, extra = int(raw[2 + 2 * index]), int(raw[3 + 2 * index])
            kind = ask.limit.kind
            if kind is Kind.WINDOW:
                frees = None if extra < 0 else float(max(extra + 60 - second, 0))
                found.append(Standing(used, frees_in_s=frees))
            elif kind is Kind.PARALLEL:
                found.append(Standing(used))
            else:
                found.append(Standing(None if used < 0 else used, reserved=extra))
        return found, gateways

    async def readings(self, asks: Sequence[Ask]) -> list[int | None]:
        """What each limit holds now (None: a budget nobody counted yet)."""
        standings, _ = await self.standing(asks)
        return [None if found.used is None else found.used + found.reserved for found in standings]


def _reserving(local: LocalCounters | None) -> bool:
    return local is not None and local.reserving()


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _seconds(ms: int) -> float:
    return float("inf") if ms < 0 else max(ms, 0) / 1000
