-- counter.lua: a sliding-window counter. Counts per fixed window of the
-- Redis clock (aligned on multiples of window_ms), and a request is
-- admitted if the previous window's count, weighted by the part of it that
-- the sliding window still covers, plus the current window's count, its
-- own cost included, is at most limit:
--
--     prev * (window - elapsed) / window + cur + cost <= limit
--
-- computed in integers (multiplied by window).
--
-- KEYS[1]  the counters, e.g. "win:counter:{user42}": a hash
--            w  the index of the current window (now_ms / window_ms)
--            c  its count
--            p  the previous window's count
--          Every admission renews its TTL to the end of the next window,
--          after which the current count no longer weighs.
-- ARGV     limit, window_ms, cost: integers, limit and cost in [1, 2^53),
--          window_ms in [1, 2^40), limit * window_ms below 2^53
-- returns  {allowed, count, retry_ms, now_ms}, all integers:
--            allowed   1 if cost was added to the current count, else 0
--            count     the weighted count after the decision, rounded up
--            retry_ms  0 if allowed, else the time until the weight of the
--                      previous window has fallen enough, or to the
--                      window's end if the current count alone is too much
--            now_ms    Redis TIME in milliseconds, rounded down

local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idx = math.floor(now / window)
local elapsed = now - idx * window -- in [0, window)

local v = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
local w = tonumber(v[1])
local cur = tonumber(v[2]) or 0
local prev = tonumber(v[3]) or 0
if w ~= idx then -- the windows moved on since the last admission
  if w == idx - 1 then
    prev = cur
  else
    prev = 0
  end
  cur = 0
end

local weighted = prev * (window - elapsed) -- the previous count, times window
if weighted + (cur + cost) * window > limit * window then
  local retry
  if cur + cost > limit then
    retry = window - elapsed
  else
    -- The smallest d with prev * (window - elapsed - d) <= (limit - cur - cost) * window.
    retry = math.ceil((weighted - (limit - cur - cost) * window) / prev)
  end
  return {0, math.ceil((weighted + cur * window) / window), retry, now}
end
cur = cur + cost
redis.call('HSET', KEYS[1], 'w', idx, 'c', cur, 'p', prev)
redis.call('PEXPIRE', KEYS[1], 2 * window - elapsed)
return {1, math.ceil((weighted + cur * window) / window), 0, now}
