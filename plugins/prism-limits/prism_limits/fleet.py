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
budget reservation expires) and ``limits:gateways`` (who admitted lately).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

from prism_proxy import SharedState

from .counting import Ask, Decision, Held, Reading
from .limits import Kind

__all__ = ["FleetCounters"]

log = logging.getLogger("prism.limits")

#: A gateway that admitted nothing for this long no longer counts in the fleet.
SEEN_MS = 30_000

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
  redis.call('SADD', KEYS[2], KEYS[1])
  if tonumber(ARGV[2]) > 0 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
end
return 1
"""

RENEW = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', until_ms, ARGV[i + 1])
end
return #KEYS
"""

REBASE = """
local keys = redis.call('SMEMBERS', KEYS[1])
for _, key in ipairs(keys) do
  redis.call('HDEL', key, 'spent')
end
redis.call('DEL', KEYS[1])
return #keys
"""

_KIND_CODES = {Kind.WINDOW: "w", Kind.PARALLEL: "p", Kind.BUDGET: "b"}
#: A budget counter outlives its period by a day (a late settlement still finds it).
_GRACE_S = 86_400


class FleetCounters:
    """The counters every gateway sharing ``link`` (Redis) counts in."""

    def __init__(self, link: SharedState, lease_s: float) -> None:
        self.link = link
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self.base = f"{link.prefix}:limits:"
        #: This gateway's calls holding leases, by call: renewed while they run.
        self.held: dict[str, Held] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def lifecycle(self) -> AsyncIterator[None]:
        renewal = asyncio.ensure_future(self._renew_forever())
        try:
            yield
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
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

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self.held and self.link.healthy:
                try:
                    await self.renew(list(self.held.values()))
                except Exception as exc:
                    log.debug("limits: renewal failed (%s)", type(exc).__name__)

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
        with self.link.guard("limits_admit"):
            answer: list[Any] = await self.link.connect().eval(ADMIT, len(keys), *keys, *args)
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
        keys = [self.key(counter), self.base + "budgets"]
        expire = 0 if reset_at is None else reset_at + _GRACE_S
        with self.link.guard("limits_rebuild"):
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
        with self.link.guard("limits_settle"):
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
            with self.link.guard("limits_renew"):
                await self.link.connect().eval(RENEW, len(keys), *keys, self.lease_ms, *members)

    async def rebase(self) -> int:
        """Every budget counter is rebuilt from the ledger on its next use."""
        with self.link.guard("limits_rebase"):
            count: int = await self.link.connect().eval(REBASE, 1, self.base + "budgets")
        return count

    async def readings(self, asks: Sequence[Ask]) -> list[int | None]:
        """What each limit holds now (None: a budget nobody counted yet)."""
        client = self.link.connect()
        found: list[int | None] = []
        with self.link.guard("limits_read"):
            seconds, _ = await client.time()
            for ask in asks:
                key = self.key(ask.counter)
                kind = ask.limit.kind
                if kind is Kind.WINDOW:
                    buckets = await client.hgetall(key)
                    found.append(sum(int(v) for at, v in buckets.items() if int(at) > seconds - 60))
                elif kind is Kind.PARALLEL:
                    found.append(await client.zcount(key, seconds * 1000, "+inf"))
                else:
                    spent, reserved = await client.hmget(key, "spent", "reserved")
                    found.append(None if spent is None else int(spent) + int(reserved or 0))
        return found


def _seconds(ms: int) -> float:
    return float("inf") if ms < 0 else max(ms, 0) / 1000
