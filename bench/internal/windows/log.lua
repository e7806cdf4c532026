-- log.lua: a sliding log. One sorted-set entry per admitted token, scored
-- by its Redis time; a request is admitted if the entries of the last
-- window_ms, its own included, are at most limit.
--
-- KEYS[1]  the log, e.g. "win:log:{user42}": a sorted set
--            member  "<seconds><microseconds>-<count>", the Redis time of
--                    the admission and the log's size with it: unique while
--                    the Redis clock does not go back
--            score   the Redis time of the admission, in microseconds
--          Every admission renews its TTL to window_ms, after which every
--          entry is out of the window.
-- ARGV     limit, window_ms, cost: integers, limit and cost in [1, 2^53)
--          with cost <= limit, window_ms in [1, 2^40)
-- returns  {allowed, count, retry_ms, now_ms}, all integers:
--            allowed   1 if cost entries were added, else 0
--            count     the entries in the window after the decision
--            retry_ms  0 if allowed, else the time until enough entries
--                      have left the window, rounded up
--            now_ms    Redis TIME in milliseconds, rounded down

local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local stamp = t[1] .. string.format('%06d', tonumber(t[2]))

-- The window is (now - window, now]: an entry window_ms old is out.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_us - window * 1000)
local n = redis.call('ZCARD', KEYS[1])
if n + cost > limit then
  -- Admitted once the (n + cost - limit)th oldest entry has left.
  local e = redis.call('ZRANGE', KEYS[1], n + cost - limit - 1, n + cost - limit - 1, 'WITHSCORES')
  -- It is newer than now - window: at least 1 ms away.
  return {0, n, math.ceil((tonumber(e[2]) + window * 1000 - now_us) / 1000), now}
end
local args = {}
for i = 1, cost do
  args[#args + 1] = stamp
  args[#args + 1] = stamp .. '-' .. (n + i)
  if #args == 200 or i == cost then -- ZADD 100 entries at a time
    redis.call('ZADD', KEYS[1], unpack(args))
    args = {}
  end
end
redis.call('PEXPIRE', KEYS[1], window)
return {1, n + cost, 0, now}
