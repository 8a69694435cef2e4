"""The Lua scripts of the Redis Streams transport (:mod:`argusdiff.service.transport.redis_streams`):
each step that must be atomic (read the first stream with work, enqueue a request, re-queue or
release a worker's entries, cancel) runs as one script on the slot of the keys it touches."""

from __future__ import annotations

__all__ = [
    "CANCEL_QUEUED",
    "CLAIM_HANDOFF",
    "CLOCK",
    "COMMITTED",
    "ENQUEUE",
    "ENQUEUE_LEVEL",
    "FORGET_OWNER",
    "READ_FIRST",
    "RELEASE",
    "REQUEUE",
    "REQUEUE_BY_TOKEN",
]

#: One non-blocking read of the first stream (KEYS, in pull order) that has an undelivered entry:
#: ``{stream, entry id, fields...}`` or nil. Atomic, so no other stream's entry is delivered.
READ_FIRST = """
for i, key in ipairs(KEYS) do
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', key, '>')
  if res then
    local entry = res[1][2][1]
    if entry then return {key, entry[1], entry[2]} end
  end
end
return nil
"""

#: The router's enqueue: a request's work items (one XADD per item, KEYS after the fixed ones), its
#: record and, for an ``Idempotency-Key``, the key's accepted value, in one atomic step that runs
#: only while Redis's clock is at or before ARGV[1] (ms; 0: no limit) -- a transaction that Redis
#: reads late (it was frozen, the router gave up and answered "not accepted") does nothing -- and only
#: once (a record already there: a retry of one that ran). ARGV[2]: the fixed keys (0 none, 1 the
#: record, 2 the record and the idempotency key); then the record's JSON and expiry (ms), the
#: reservation the idempotency key must still hold, its accepted value and expiry; then one item
#: JSON per stream key. Returns {'ok', entry ids...}, {'expired'}, {'exists'} or {'conflict'}.
ENQUEUE = """
local limit = tonumber(ARGV[1])
if limit > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now > limit then return {'expired'} end
end
local fixed = tonumber(ARGV[2])
if fixed >= 1 and redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
if fixed == 2 and redis.call('GET', KEYS[2]) ~= ARGV[5] then return {'conflict'} end
local out = {'ok'}
for i = fixed + 1, #KEYS do
  out[#out + 1] = redis.call('XADD', KEYS[i], '*', 'item', ARGV[7 + i - fixed])
end
if fixed >= 1 then redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4]) end
if fixed == 2 then redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[7]) end
return out
"""

#: Cluster mode, one level's part of an enqueue (its keys share the level's slot): KEYS[1] the
#: request's marker at this level (set for ARGV[1] ms; 0: no marker, a hand-off), then one stream per
#: item (ARGV[2...]: their JSON). A marker already there means a retry of a part that ran:
#: {'exists'}; else {'ok', entry ids...}.
ENQUEUE_LEVEL = """
if ARGV[1] ~= '0' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
end
local out = {'ok'}
for i = 2, #KEYS do
  out[#out + 1] = redis.call('XADD', KEYS[i], '*', 'item', ARGV[i])
end
return out
"""

#: Cluster mode, a worker's check of an item it took: {whether the request's record exists, the
#: control slot's clock in ms} (KEYS[1]: the record).
COMMITTED = """
local t = redis.call('TIME')
return {redis.call('EXISTS', KEYS[1]), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
"""

# A cascade hand-off's claim: the first router to set it decides; the same router may claim it
# again (its first decision failed to reach Redis and it retries), no other can.
CLAIM_HANDOFF = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""

#: Redis's clock (ms) on the node of KEYS[1] (the control slot's, on a cluster).
CLOCK = """
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: The re-queue both fences lead into: each (entry id, copy) pair of ARGV from 4 on whose entry is
#: still pending at consumer ARGV[2] (group ARGV[1]) is copied to KEYS[3] (or back to KEYS[1]) unless
#: its copy is '' (deleted: acked only), then acked and deleted; returns the number of copies queued.
_REQUEUE_PENDING = """local moved = 0
for i = 4, #ARGV, 2 do
  local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #held > 0 then
    if ARGV[i + 1] ~= '' then
      redis.call('XADD', KEYS[3] or KEYS[1], '*', 'item', ARGV[i + 1])
      moved = moved + 1
    end
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('XDEL', KEYS[1], ARGV[i])
  end
end
return moved
"""

#: Re-queue entries pending at a dead consumer, fenced: only while KEYS[2] (the leader lease) holds
#: ARGV[3] ('' : no fence), and only the entries still pending at that consumer (a worker's
#: XAUTOCLAIM may have taken one meanwhile). KEYS[1]: the stream, KEYS[3] (optional, in its slot) the
#: stream the copies go to (a worker's own stream's go to the level's); ARGV[1] group, ARGV[2] consumer,
#: then (entry id, the copy's item JSON, '' for a deleted entry: acked only) pairs. Returns the
#: number of copies queued, or -1 when the fence refused.
REQUEUE = (
    """
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
"""
    + _REQUEUE_PENDING
)

#: Cluster mode: the re-queue of :data:`REQUEUE`, fenced by the level's own copy of the highest
#: leader token that re-queued there (KEYS[2], in the level's slot; ARGV[3] this leader's token, ''
#: none): a token below it is refused (-1), so once a newer leader has acted at a level a stale one
#: cannot; before it, the pending check alone keeps an item from being queued twice.
REQUEUE_BY_TOKEN = (
    """
if ARGV[3] ~= '' then
  if tonumber(ARGV[3]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return -1 end
  redis.call('SET', KEYS[2], ARGV[3])
end
"""
    + _REQUEUE_PENDING
)

#: Release a worker's own stream (KEYS[1]) to the level's stream of the same tier (KEYS[2], same
#: slot): up to ARGV[3] entries no consumer has taken yet are read by the releasing consumer
#: (ARGV[2], group ARGV[1]), queued on KEYS[2] and deleted from KEYS[1], in one atomic step (an entry
#: is in exactly one of the two). Returns the number moved.
RELEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- a stream a router recreated after it was forgotten has no group yet: every entry is unread
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')
local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', tonumber(ARGV[3]), 'STREAMS', KEYS[1], '>')
local moved = 0
if res then
  for _, entry in ipairs(res[1][2]) do
    local f = entry[2]
    if f then
      for j = 1, #f, 2 do
        if f[j] == 'item' then
          redis.call('XADD', KEYS[2], '*', 'item', f[j + 1])
          moved = moved + 1
        end
      end
    end
    redis.call('XACK', KEYS[1], ARGV[1], entry[1])
    redis.call('XDEL', KEYS[1], entry[1])
  end
end
return moved
"""

#: Forget a worker's own streams of a level (KEYS[1..n-1]) once they are empty and nothing is
#: pending there, and take it off the level's owners (KEYS[n], ARGV[2] the worker): 1 when done.
FORGET_OWNER = """
for i = 1, #KEYS - 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('XLEN', KEYS[i]) > 0 then return 0 end
    local ok, p = pcall(redis.call, 'XPENDING', KEYS[i], ARGV[1])
    if ok and tonumber(p[1]) > 0 then return 0 end
  end
end
for i = 1, #KEYS - 1 do redis.call('DEL', KEYS[i]) end
redis.call('SREM', KEYS[#KEYS], ARGV[2])
return 1
"""

#: Delete a stream entry only if no consumer has it pending (no worker took it): 1 when deleted.
CANCEL_QUEUED = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending > 0 then return 0 end
return redis.call('XDEL', KEYS[1], ARGV[2])
"""
