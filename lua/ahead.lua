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
-- at rate since ts with settle.lua's arithmetic (a clock that went back
-- refills nothing and ts never moves back), and take cost if that leaves no
-- more than debt owed: t - cost >= -debt. A take writes the bucket with the
-- TTL settle.lua gives it, until it is full again: a readable hash keeps
-- its other fields (records, an outage's pool) and gets t and ts in one
-- HSET, then PEXPIRE; anything else becomes the string "<t> <ts>" with SET
-- PX. A call that takes nothing writes nothing.

local MAX_LIMIT = 1125899906842624   -- 2^50
local MAX_AMOUNT = 9007199254740991  -- 2^53 - 1
local MAX_TTL_MS = 8796093022208     -- 2^43 ms, settle.lua's bound
local EXACT = 9007199254740992       -- 2^53
local MICRO = 1000000

local floor, ceil, find, match, format = math.floor, math.ceil, string.find, string.match, string.format
local tonumber, tostring = tonumber, tostring

if #KEYS ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 key, got ' .. #KEYS)
end
if #ARGV ~= 4 then
  return redis.error_reply('ERR hybrid: want 4 arguments (rate, burst, cost, debt), got ' .. #ARGV)
end
local A = {}
for i, name in ipairs({'rate', 'burst', 'cost', 'debt'}) do
  local v = tonumber(ARGV[i])
  local lo = 1
  if name == 'debt' then
    lo = 0
  end
  if v == nil or v ~= v or v < lo or v > MAX_LIMIT or v ~= floor(v) then
    return redis.error_reply('ERR hybrid: ' .. name .. ' ' .. tostring(ARGV[i]) ..
      ' is not an integer in [' .. lo .. ', 2^50]')
  end
  A[i] = v
end
local rate, burst, cost, debt = A[1], A[2], A[3], A[4]
if cost > burst then
  return redis.error_reply('ERR hybrid: cost ' .. tostring(ARGV[3]) .. ' is above burst ' .. tostring(ARGV[2]))
end

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and this
  -- script reads TIME before it writes.
  redis.replicate_commands()
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])

-- The state, as settle.lua reads it (and peek.lua). pcall, so that
-- WRONGTYPE is seen here; any other error is passed on.
local t, ts
local hash = false -- a readable hash: written as one
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  t, ts = match(v, '^(%-?%d+) (%d+)$')
  t, ts = tonumber(t), tonumber(ts)
elseif v and not find(v.err, 'WRONGTYPE', 1, true) then
  return redis.error_reply(v.err)
elseif v then
  local state = redis.pcall('HMGET', KEYS[1], 't', 'ts')
  if state.err then
    if not find(state.err, 'WRONGTYPE', 1, true) then
      return redis.error_reply(state.err)
    end
  else
    t, ts = tonumber(state[1]), tonumber(state[2])
    hash = true
  end
end
if t == nil or ts == nil or t % 1 ~= 0 or ts % 1 ~= 0 or not (ts >= 0 and ts <= MAX_AMOUNT) then
  t, ts, hash = burst, now, false -- a full bucket, written as a string
end
if t > burst then
  t = burst
elseif t < -MAX_LIMIT then
  t = -MAX_LIMIT
end
-- Refill from ts to now with settle.lua's gain, in the main chunk (a
-- function would be a closure made again at every call): exact; beyond
-- MAX_AMOUNT it only needs to reach the deficit, below 2^51.
if now > ts then
  if t < burst then
    local e = now - ts
    local es = floor(e / MICRO)
    local eu = e - es * MICRO
    if eu < 0 then
      es, eu = es - 1, eu + MICRO
    elseif eu >= MICRO then
      es, eu = es + 1, eu - MICRO
    end
    local add = es * rate
    if add < MAX_AMOUNT then
      local rq = floor(rate / MICRO)
      add = add + eu * rq + floor(eu * (rate - rq * MICRO) / MICRO)
    end
    if add >= burst - t then
      t = burst
    else
      t = t + add
    end
  end
  ts = now
end

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
