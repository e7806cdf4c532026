-- ahead.lua: take tokens from the token bucket in KEYS[1] ahead of time,
-- into debt, all or nothing: what a caller that waits for its tokens takes
-- when it asks, so that it then sleeps until they are due instead of asking
-- again (x/time/rate's Reserve, on the fleet's bucket).
--
-- KEYS[1]  a bucket as settle.lua keeps it: a string "<t> <ts>", or a hash
--          with fields t and ts (micro-tokens, and the Redis time of t in
--          microseconds)
-- ARGV     rate, burst, cost, debt, integers:
--            rate   micro-tokens per second, in [1, 2^50]
--            burst  micro-tokens, in [1, 2^50]
--            cost   micro-tokens to take, in [1, burst]
--            debt   micro-tokens the bucket may owe after the take at most,
--                   in [0, 2^50]: the refill of the longest the caller
--                   would wait for its tokens
-- returns  {granted, tokens, now_us}, integers:
--            granted  cost if taken, else 0
--            tokens   micro-tokens the bucket holds after the call (below 0
--                     while it owes: the taker's tokens are due once it is
--                     back at 0, -tokens / rate seconds from now_us), in
--                     [-2^50, burst]
--            now_us   Redis TIME in microseconds
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV, before anything is read.
--
-- The step, with now from Redis TIME: read the bucket as settle.lua does (a
-- missing key, or one settle.lua would replace, is a full bucket), refill it
-- at rate since ts with settle.lua's arithmetic (bucket.lua, below: a clock
-- that went back refills nothing and ts never moves back), and take cost if
-- that leaves no more than debt owed: t - cost >= -debt. A take writes the
-- bucket with the
-- TTL settle.lua gives it, until it is full again (and a reset's mark is
-- no longer kept): a readable hash keeps
-- its other fields (records, an outage's pool) and gets t and ts in one
-- HSET, then PEXPIRE; anything else becomes the string "<t> <ts>" with SET
-- PX. A call that takes nothing writes nothing.

local ARGS = {{'rate', 1}, {'burst', 1}, {'cost', 1, 2}, {'debt', 0}}
--[[bucket.lua]]
local MAX_TTL_MS = 8796093022208     -- 2^43 ms, settle.lua's bound
local EXACT = 9007199254740992       -- 2^53
local cost, debt = A[3], A[4]

if t - cost < -debt then
  return {0, t, now}
end
t = t - cost

-- The TTL, settle.lua's: until the bucket is full again, after ts.
local num = (burst - t) * 1000
local ttl = ceil(num / rate)
if num >= EXACT then
  ttl = ttl + 1
end
if ts > now then
  ttl = ttl + ceil((ts - now) / 1000)
end
if hash and zkeep and zkeep > now and ttl < ceil((zkeep - now) / 1000) then
  ttl = ceil((zkeep - now) / 1000) -- a reset's mark is kept that long
end
if ttl < 1000 then
  ttl = 1000
elseif ttl > MAX_TTL_MS then
  ttl = MAX_TTL_MS
end
if hash then
  redis.call('HSET', KEYS[1], 't', format('%.0f', t), 'ts', format('%.0f', ts))
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('SET', KEYS[1], format('%.0f %.0f', t, ts), 'PX', ttl)
end
return {cost, t, now}
