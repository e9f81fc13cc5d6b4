"""The Lua scripts: each is one atomic step on the shared state (Redis runs a script whole).

Times that decide who holds a slot come from Redis's own clock (``TIME``),
so gateways whose clocks disagree still agree on when a lease ends.
"""

from __future__ import annotations

__all__ = [
    "ADD_OVERRIDE",
    "END_OVERRIDE",
    "EXCHANGE",
    "RECORD",
    "REPUBLISH",
    "TAKE_LEASE",
    "RENEW_LEASES",
]

# An audit row: "id|json", newest first, the list kept to ARGV[2] rows.
# KEYS[2] the audit list, KEYS[3] its id counter.
_AUDIT = """
local function audit(entry)
  local id = redis.call('INCR', KEYS[3])
  redis.call('LPUSH', KEYS[2], id .. '|' .. entry)
  redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
end
local function changed(what)
  redis.call('INCR', KEYS[4])
  redis.call('SET', KEYS[5], '1')
  redis.call('PUBLISH', ARGV[1], what)
end
"""

#: Automatic transitions, oldest first.  KEYS: bindings hash, audit, audit id,
#: version, born marker.  ARGV: channel, audit max, then per transition
#: binding, revision, from state, record json, audit json.  A transition lands
#: on top of the revision it was made from (or on a binding with no record).
#: Otherwise another gateway moved first: a trip (an open state to isolated)
#: still lands, renumbered on top of the stored revision, when the stored state
#: is open too (eligible or suspect: the evidence that tripped it stands);
#: anything else is refused.  Once one of a binding's transitions is refused or
#: renumbered its later ones in the batch are dropped.  A transition whose very
#: record is stored already (a write that landed though its answer was lost,
#: sent again) counts as landed, without a second audit row.  Returns the stored
#: record of every binding whose transitions did not all land as sent.
RECORD = (
    _AUDIT
    + """
local open = {eligible = true, suspect = true}
local settled = {}
local reply = {}
for i = 3, #ARGV, 5 do
  local binding = ARGV[i]
  local current = not settled[binding] and redis.call('HGET', KEYS[1], binding)
  if current == ARGV[i + 3] then
    -- Stored already: a write that landed though its answer was lost, sent again.
  elseif not settled[binding] then
    local revision = tonumber(ARGV[i + 1])
    local record, entry = ARGV[i + 3], ARGV[i + 4]
    local stored = current and cjson.decode(current)
    local lands = (not stored) or stored['revision'] == revision - 1
    if not lands then
      local mine = cjson.decode(record)
      if mine['state'] == 'isolated' and open[ARGV[i + 2]] and open[stored['state']] then
        mine['revision'] = stored['revision'] + 1
        mine['isolated_revision'] = mine['revision']
        record = cjson.encode(mine)
        local row = cjson.decode(entry)
        row['revision'] = mine['revision']
        entry = cjson.encode(row)
        lands = true
        settled[binding] = true
        table.insert(reply, record)
      end
    end
    if lands then
      redis.call('HSET', KEYS[1], binding, record)
      audit(entry)
      changed(binding)
    else
      settled[binding] = true
      table.insert(reply, current)
    end
  end
end
return reply
"""
)

#: A gateway's state offered after an outage.  KEYS: bindings hash, overrides
#: hash, version, born marker.  ARGV: channel, number of records, then binding
#: and record json pairs, then override id and json pairs.  A record lands if
#: it is newer than the stored one; overrides only if Redis lost everything
#: (no born marker): otherwise one released meanwhile would come back.
REPUBLISH = """
local lost = redis.call('EXISTS', KEYS[4]) == 0
local n = tonumber(ARGV[2])
local any = false
for i = 3, 2 + 2 * n, 2 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  local newer = true
  if current then
    newer = cjson.decode(current)['revision'] < cjson.decode(ARGV[i + 1])['revision']
  end
  if newer then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    any = true
  end
end
if lost then
  for i = 3 + 2 * n, #ARGV, 2 do
    if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then any = true end
  end
end
redis.call('SET', KEYS[4], '1')
if any then
  redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', ARGV[1], 'republish')
end
return any and 1 or 0
"""

#: KEYS: overrides hash, audit, audit id, version, born marker.  ARGV: channel,
#: audit max, override id, override json, audit json.
ADD_OVERRIDE = (
    _AUDIT
    + """
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
audit(ARGV[5])
changed(ARGV[3])
return 1
"""
)

#: KEYS as ADD_OVERRIDE.  ARGV: channel, audit max, override id, audit json.
#: Only the caller that removes it records the audit row; returns its json.
END_OVERRIDE = (
    _AUDIT
    + """
local current = redis.call('HGET', KEYS[1], ARGV[3])
if not current then return false end
redis.call('HDEL', KEYS[1], ARGV[3])
audit(ARGV[4])
changed(ARGV[3])
return current
"""
)

#: One binding's report and the fleet's reply.  KEYS: window hash (of one
#: isolation epoch), latency hash, trial successes hash.  ARGV: me, now (wall
#: seconds), window_s, latency_window_s, trial revision ('' for none), new
#: trial successes, number of latency kinds, then kind/samples/median triples,
#: then second/calls/failures triples.  Window fields are "who|second|c" and
#: "who|second|f"; latency fields "who|kind" = "samples median at".  Returns
#: {others' calls, others' failures, fleet trial successes, kind, samples,
#: median, ...} with medians as strings.
EXCHANGE = """
local me = ARGV[1]
local now = tonumber(ARGV[2])
local window_s = tonumber(ARGV[3])
local latency_s = tonumber(ARGV[4])
local kinds = tonumber(ARGV[7])
local i = 8
for _ = 1, kinds do
  redis.call('HSET', KEYS[2], me .. '|' .. ARGV[i], ARGV[i + 1] .. ' ' .. ARGV[i + 2] .. ' ' .. now)
  i = i + 3
end
while i <= #ARGV do
  redis.call('HINCRBY', KEYS[1], me .. '|' .. ARGV[i] .. '|c', ARGV[i + 1])
  redis.call('HINCRBY', KEYS[1], me .. '|' .. ARGV[i] .. '|f', ARGV[i + 2])
  i = i + 3
end
local calls, failures = 0, 0
local fields = redis.call('HGETALL', KEYS[1])
for j = 1, #fields, 2 do
  local who, second, what = string.match(fields[j], '^(.+)|(%d+)|([cf])$')
  if second == nil or tonumber(second) <= now - window_s then
    redis.call('HDEL', KEYS[1], fields[j])
  elseif who ~= me then
    if what == 'c' then calls = calls + tonumber(fields[j + 1])
    else failures = failures + tonumber(fields[j + 1]) end
  end
end
if #fields > 0 then redis.call('EXPIRE', KEYS[1], math.ceil(window_s) + 60) end
local reply = {calls, failures, 0}
local baselines = redis.call('HGETALL', KEYS[2])
for j = 1, #baselines, 2 do
  local who, kind = string.match(baselines[j], '^(.+)|(%a+)$')
  local samples, median, at = string.match(baselines[j + 1], '^(%d+) (%S+) (%S+)$')
  if who == nil or at == nil or tonumber(at) <= now - latency_s then
    redis.call('HDEL', KEYS[2], baselines[j])
  elseif who ~= me then
    table.insert(reply, kind)
    table.insert(reply, tonumber(samples))
    table.insert(reply, median)
  end
end
if #baselines > 0 then redis.call('EXPIRE', KEYS[2], math.ceil(latency_s) + 60) end
if ARGV[5] ~= '' then
  reply[3] = redis.call('HINCRBY', KEYS[3], ARGV[5], ARGV[6])
  redis.call('EXPIRE', KEYS[3], 86400)
end
return reply
"""

#: A slot among at most ARGV[2], leased for ARGV[3] ms to member ARGV[1].
#: KEYS: the leases (a sorted set scored by expiry), and the earliest time the
#: next slot may go (KEYS[2], optional: ARGV[4] ms of spacing).  1 or 0.
TAKE_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
local spacing = tonumber(ARGV[4] or '0')
if spacing > 0 then
  local next_at = tonumber(redis.call('GET', KEYS[2]) or '0')
  if now < next_at then return 0 end
  redis.call('SET', KEYS[2], now + spacing, 'PX', math.ceil(spacing))
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[3]))
return 1
"""

#: Extend the leases ARGV[2..] by ARGV[1] ms from now (those still held).
RENEW_LEASES = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[1]))
return 1
"""
