"""The Lua scripts of the fleet's counters (prism_limits.fleet runs them).

Each runs atomically in Redis, on Redis's clock.  ``ADMIT`` checks a call
against all its limits and, only if it fits every one, reserves it on all;
``SETTLE`` gives back what a call held and counts what it used (and
remembers its cost a while under its request id); ``REBUILT`` sets a budget
counter from a ledger read unless another gateway did first, adding the
remembered costs of calls that read did not count yet;
``RENEW`` keeps the leases of calls in flight; ``REBASE`` drops the budget
counters; ``LOOK`` reads counters without changing them.
"""

from __future__ import annotations

__all__ = ["ADMIT", "LOOK", "REBASE", "REBUILT", "RENEW", "SETTLE"]

ADMIT = """
-- The per-limit arguments come packed in one (one string to send, not five per limit).
local A = {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]}
for field in string.gmatch(ARGV[6], '[^ ]+') do A[#A + 1] = field end
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, lease, me, n = A[1], tonumber(A[2]), A[3], tonumber(A[4])
local gw = KEYS[2 * n + 1]
redis.call('ZADD', gw, now, me)
redis.call('ZREMRANGEBYSCORE', gw, '-inf', now - tonumber(A[5]))
redis.call('PEXPIRE', gw, 2 * tonumber(A[5]))
local gateways = redis.call('ZCARD', gw)
local missing = {}
for i = 1, n do
  local a = 5 + (i - 1) * 5
  if A[a + 1] == 'b' and redis.call('HEXISTS', KEYS[2 * i - 1], 'spent') == 0 then
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
  local kind, value, amount = A[a + 1], tonumber(A[a + 2]), tonumber(A[a + 3])
  local soft = A[a + 4] == '1'
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
    reset = tonumber(A[a + 5])
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
  local kind, amount = A[a + 1], A[a + 3]
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
-- The per-limit arguments come packed in one (one string to send, not five per limit).
local A = {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]}
for field in string.gmatch(ARGV[7], '[^ ]+') do A[#A + 1] = field end
local member, second, cost = A[1], A[2], A[4]
local tokens, n, recent_ms = tonumber(A[3]), tonumber(A[5]), tonumber(A[6])
for i = 1, n do
  local a = 6 + (i - 1) * 2
  local kind, amount = A[a + 1], tonumber(A[a + 2])
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
local now = 0
if cost ~= '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local spent = {}
for i = 2 * n + 1, #KEYS, 3 do
  local key, recent, counted = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  if cost ~= '0' then
    -- Remembered a while: a rebuild that read the ledger before this call's row was
    -- in it adds this cost (see REBUILT).
    redis.call('ZADD', recent, now, member .. ' ' .. cost)
    redis.call('ZREMRANGEBYSCORE', recent, '-inf', now - recent_ms)
    redis.call('PEXPIRE', recent, 2 * recent_ms)
  end
  if redis.call('HEXISTS', key, 'spent') == 0 then
    spent[#spent + 1] = -1
  elseif cost ~= '0' and redis.call('SISMEMBER', counted, member) == 0 then
    spent[#spent + 1] = redis.call('HINCRBY', key, 'spent', cost)
  else
    -- Nothing to add, or the ledger read that rebuilt the counter had this call.
    spent[#spent + 1] = tonumber(redis.call('HGET', key, 'spent'))
  end
end
return spent
"""

REBUILT = """
-- KEYS: the counter, the rebuilt counters' index, the counter's recent settlements
-- and the calls its ledger read counted.  ARGV: the ledger's total, when the counter
-- expires, how long settlements are remembered, the ids the ledger read counted.
if redis.call('HSETNX', KEYS[1], 'spent', ARGV[1]) == 0 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local recent_ms = tonumber(ARGV[3])
local counted = {}
for id in string.gmatch(ARGV[4], '[^ ]+') do
  counted[id] = true
  redis.call('SADD', KEYS[4], id)
end
redis.call('PEXPIRE', KEYS[4], 2 * recent_ms)
-- Calls settled here whose rows the ledger read did not hold yet: their cost is
-- in no total the read returned.
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - recent_ms)
for _, entry in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local id, cost = string.match(entry, '^(%S+) (%S+)$')
  if id and not counted[id] then redis.call('HINCRBY', KEYS[1], 'spent', cost) end
end
local expire = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. t[1])
if expire > 0 then
  redis.call('EXPIREAT', KEYS[1], expire)
  redis.call('ZADD', KEYS[2], expire, KEYS[1])
else
  redis.call('ZADD', KEYS[2], '+inf', KEYS[1])
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
