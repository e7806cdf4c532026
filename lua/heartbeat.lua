-- heartbeat.lua: count the live instances of a fleet, in Redis.
--
-- Every instance of the fleet beats now and then under an id of its own; an
-- instance not heard from within ttl_ms is dead and is dropped by the next
-- call. The count is what an instance divides the limit by while Redis is out
-- of reach.
--
-- KEYS[1]  the fleet, e.g. "hybrid:fleet{fleet}": a sorted set
--            member  an instance id
--            score   the Redis time of its last beat, in milliseconds
--          A missing key is an empty fleet.
-- KEYS[2]  optional: the instance's witness, e.g. "hybrid:fleet{fleet}:<id>"
--          (in KEYS[1]'s slot): a string, the Redis time of its last beat
--          in milliseconds, kept for 10 * ttl_ms and at least 10 minutes,
--          whatever the fleet's reaping
-- KEYS[3]  optional, with KEYS[2]: the fleet's resets, e.g.
--          "hybrid:resets{fleet}" (in KEYS[1]'s slot): a sorted set of the
--          bucket keys reset lately (reset.lua), scored by the Redis time of
--          their reset in milliseconds, kept 10 minutes
-- ARGV     id, ttl_ms, leave
--            id      the instance, 1 to 256 bytes, any bytes
--            ttl_ms  how long a beat keeps an instance live, an integer in
--                    [1, 2^40]
--            leave   "0" to beat, "1" to remove id instead
-- returns  {live, now_ms, was_ms, reset_ms}, all integers:
--            live    instances heard from within ttl_ms of now, after the
--                    call (so at least 1 after a beat)
--            now_ms  Redis TIME in milliseconds, rounded down
--            was_ms  the instance's last beat before the call, from
--                    KEYS[2], 0 if none (or no KEYS[2]): an instance
--                    that finds an older beat than its last one talks to
--                    a Redis that lost its writes since (a failover to a
--                    replica that lagged, say)
--            reset_ms  the Redis time of the latest reset in KEYS[3], 0 if
--                    none (or no KEYS[3]): an instance that has not seen it
--                    yet stops trusting its views of the buckets from
--                    before it
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV, before anything is read;
--          WRONGTYPE when KEYS[1] holds something other than a sorted set,
--          before anything is written.
--
-- One call, with now from Redis TIME:
--   0. was = KEYS[2] (GET), 0 if none; a beat sets KEYS[2] to now (SET
--      PX), a leave deletes it
--   1. a beat sets id's score to now (ZADD); leave removes id (ZREM)
--   2. every member whose score is at or below now - ttl_ms is removed
--      (ZREMRANGEBYSCORE): a beat counts for ttl_ms and no longer
--   3. live = ZCARD
--   4. if the set still exists (an empty sorted set does not), it expires
--      2 * ttl_ms from now, at least 1 s: a fleet that stops beating
--      vanishes, and a set that lives on always has its TTL renewed
--   5. with KEYS[3]: the resets older than 10 minutes are removed, and
--      reset_ms is the highest score left
--
-- Each call reaps with its own ttl_ms, so the fleet should agree on one.
-- All numbers stay below 2^53 and are written with %.0f.

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and this
  -- script reads TIME before it writes. Later versions always replicate
  -- effects and accept the call.
  redis.replicate_commands()
end

local MAX_ID = 256
local MAX_TTL_MS = 1099511627776 -- 2^40 ms, about 35 years
local RESETS_MS = 600000          -- how long a reset is told: 10 minutes

if #KEYS < 1 or #KEYS > 3 then
  return redis.error_reply('ERR hybrid: want 1 to 3 keys, got ' .. #KEYS)
end
if #ARGV ~= 3 then
  return redis.error_reply('ERR hybrid: want 3 arguments (id, ttl_ms, leave), got ' .. #ARGV)
end

local id = ARGV[1]
if #id < 1 or #id > MAX_ID then
  return redis.error_reply('ERR hybrid: id of ' .. #id .. ' bytes, want 1 to ' .. MAX_ID)
end
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl ~= ttl or ttl < 1 or ttl > MAX_TTL_MS or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR hybrid: ttl_ms ' .. tostring(ARGV[2]) ..
    ' is not an integer in [1, ' .. string.format('%.0f', MAX_TTL_MS) .. ']')
end
local leave = ARGV[3]
if leave ~= '0' and leave ~= '1' then
  return redis.error_reply('ERR hybrid: leave ' .. tostring(leave) .. ' is not 0 or 1')
end

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- 1. Beat or leave.
local was = 0
if #KEYS >= 2 then
  was = tonumber(redis.call('GET', KEYS[2]))
  if was == nil or was ~= was or was < 0 or was ~= math.floor(was) then
    was = 0
  end
end

if leave == '1' then
  redis.call('ZREM', key, id)
  if #KEYS >= 2 then
    redis.call('DEL', KEYS[2])
  end
else
  redis.call('ZADD', key, string.format('%.0f', now), id)
  if #KEYS >= 2 then
    local keep = 10 * ttl
    if keep < 600000 then
      keep = 600000
    end
    if keep > MAX_TTL_MS then
      keep = MAX_TTL_MS
    end
    redis.call('SET', KEYS[2], string.format('%.0f', now), 'PX', string.format('%.0f', keep))
  end
end

-- 2. Drop the dead: a member is live while now - score < ttl.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - ttl))

-- 3. Count.
local live = redis.call('ZCARD', key)

-- 4. Keep the set alive while someone beats.
if live > 0 then
  local expire = 2 * ttl
  if expire < 1000 then
    expire = 1000
  end
  redis.call('PEXPIRE', key, string.format('%.0f', expire))
end

-- 5. The latest reset.
local reset = 0
if #KEYS == 3 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now - RESETS_MS))
  local last = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if last[2] then
    reset = tonumber(last[2]) or 0
  end
end

return {live, now, was, reset}
