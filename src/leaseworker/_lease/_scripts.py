"""The three lease scripts. Each runs atomically in Redis; keys arrive as KEYS.

Fences never go backwards, even after Redis loses the counter (restart without
persistence, failover to a lagging replica): a new fence is
``max(last + 1, server time in microseconds)``. Server time moves forward across
restarts, so a store that rejects lower fences keeps accepting new owners.

Each acquisition may leave a note (an opaque text: telemetry puts the trace
reference of its execution there) in a third key of the same slot, and gets
back the note its predecessor left: the successor of a lost execution knows
which one it took over from, in the same round trip.
"""

from __future__ import annotations

# KEYS[1] lease key, KEYS[2] fence key, KEYS[3] note key; ARGV[1] owner token,
# ARGV[2] ttl in ms, ARGV[3] this acquisition's note ('' for none: the key is deleted,
# so a successor never mistakes an older note for its predecessor's).
# Returns {1, fence, the previous note or ''} when acquired, {0, holder's pttl in ms} when busy.
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  local fence = math.max(last + 1, floor)
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
  local previous = redis.call('GET', KEYS[3]) or ''
  if ARGV[3] == '' then
    redis.call('DEL', KEYS[3])
  else
    redis.call('SET', KEYS[3], ARGV[3])
  end
  return {1, fence, previous}
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
