"""The three lease scripts. Each runs atomically in Redis; keys arrive as KEYS.

Fences never go backwards, even after Redis loses the counter (restart without
persistence, failover to a lagging replica): a new fence is
``max(last + 1, server time in microseconds)``. Server time moves forward across
restarts, so a store that rejects lower fences keeps accepting new owners.

Each acquisition may leave a note (an opaque text: telemetry puts the trace
reference of its execution there) and gets back the note its predecessor left,
in the same round trip: the successor of a lost execution knows which one it
took over from. The note lives in the fence key's value, after the fence and
one space (``"<fence> <note>"``; a bare ``"<fence>"`` without a note, as scripts
before notes moved there wrote it), so an acquisition writes one key besides
the lease: ``SET ... GET`` stores the new value and returns the old one.
"""

from __future__ import annotations

# KEYS[1] lease key, KEYS[2] fence key; ARGV[1] owner token, ARGV[2] lease_duration in ms,
# ARGV[3] this acquisition's note ('' for none: a successor then gets none, never an
# older note). Returns {1, fence, the previous note or ''} when acquired, {0, holder's
# pttl in ms} when busy. The fence key is first set to the time floor (the common
# case: it is above the last fence) and set once more only when the last fence is not
# below it (two acquisitions in one microsecond, or a server clock that went back).
ACQUIRE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local note = ARGV[3] == '' and '' or ' ' .. ARGV[3]
local stored = redis.call('SET', KEYS[2], string.format('%.0f', fence) .. note, 'GET')
local last, previous = 0, ''
if stored then
  local digits, rest = string.match(stored, '^(%d+) ?(.*)$')
  last, previous = tonumber(digits) or 0, rest or ''
end
if last >= fence then
  fence = last + 1
  redis.call('SET', KEYS[2], string.format('%.0f', fence) .. note)
end
return {1, fence, previous}
"""

# KEYS[1] lease key; ARGV[1] owner token, ARGV[2] lease_duration in ms. 1 renewed, 0 not ours.
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


def fence_of(stored: bytes | str) -> int:
    """Return the fence in a fence key's value (``"<fence>"`` or ``"<fence> <note>"``)."""
    text = stored.decode() if isinstance(stored, bytes) else stored
    return int(text.partition(" ")[0])
