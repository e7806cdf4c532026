-- fixed.lua: a fixed window. One counter per window of the Redis clock,
-- the windows aligned on multiples of window_ms since the Unix epoch.
--
-- KEYS[1]  the counter, e.g. "win:fixed:{user42}": a string, the cost
--          admitted in the current window. It is created with a TTL that
--          ends with the window, so the next window finds it gone. Redis
--          drops a key only once its clock is past the deadline: in the
--          first millisecond of a window it still holds the last window's
--          count, with a PTTL of 0, which is then read as gone.
-- ARGV     limit, window_ms, cost: integers, limit and cost in [1, 2^53),
--          window_ms in [1, 2^40)
-- returns  {allowed, count, retry_ms, now_ms}, all integers:
--            allowed   1 if cost was added to the count, else 0
--            count     the window's count after the decision
--            retry_ms  0 if allowed, else the time to the window's end
--            now_ms    Redis TIME in milliseconds, rounded down

local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = window - now % window -- to the window's end, in [1, window]

local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 and left == window and redis.call('PTTL', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1]) -- the last window's, at its deadline
  n = 0
end
if n + cost > limit then
  return {0, n, left, now}
end
n = redis.call('INCRBY', KEYS[1], cost)
if n == cost then -- the window's first admission created the key
  redis.call('PEXPIRE', KEYS[1], left)
end
return {1, n, 0, now}
