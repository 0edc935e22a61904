"""The three lease scripts. Each runs atomically in Redis; keys arrive as KEYS.

Fences never go backwards, even after Redis loses the counter (restart without
persistence, failover to a lagging replica): a new fence is
``max(last + 1, server time in microseconds)``. Server time moves forward across
restarts, so a store that rejects lower fences keeps accepting new owners.
"""

from __future__ import annotations

# KEYS[1] lease key, KEYS[2] fence key; ARGV[1] owner token, ARGV[2] ttl in ms.
# Returns {1, fence} when acquired, {0, holder's pttl in ms} when busy.
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  local fence = math.max(last + 1, floor)
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] lease key; ARGV[1] owner token, ARGV[2] ttl in ms. 1 renewed, 0 not ours.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] lease key; ARGV[1] owner token. 1 deleted, 0 not ours (or gone).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
