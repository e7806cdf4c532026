-- settle.lua: one step of an authoritative token bucket, in Redis.
--
-- It serves both a settlement round (charge what was spent, take back what
-- was not, grant what is wanted next) and the exact limiter (grant all of a
-- cost or nothing).
--
-- KEYS[1]  the bucket, e.g. "hybrid:{user42}": a hash with fields
--            t   tokens, in micro-tokens, in [-burst, burst]
--            ts  the Redis time of t, in microseconds
--          A missing key is a full bucket. A key that holds another type,
--          or a hash whose t or ts is unreadable, is deleted and replaced by
--          a full bucket (reset = 1 in the reply): it never stays stuck.
-- ARGV     rate, burst, consumed, returned, want, min_grant, quantum
--            rate       micro-tokens per second, an integer in [1, 2^50]
--            burst      micro-tokens, an integer in [1, 2^50]
--            consumed   micro-tokens spent elsewhere, to charge (>= 0)
--            returned   micro-tokens granted before and not spent (>= 0)
--            want       micro-tokens wanted now (>= 0)
--            min_grant  grant nothing rather than less than this (>= 0)
--            quantum    micro-tokens; the grant is a whole number of these,
--                       an integer in [1, 2^50] (1 does not round)
--          consumed, returned, want and min_grant are integers below 2^53.
-- returns  {granted, tokens, now_us, reset}, all integers:
--            granted    micro-tokens granted: 0, or in [min_grant, want],
--                       a multiple of quantum
--            tokens     micro-tokens left after the step, in [-burst, burst]
--            now_us     Redis TIME in microseconds
--            reset      1 if KEYS[1] held something unreadable (another
--                       type, garbled fields) and was replaced, else 0
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV, before anything is read.
--
-- One step, with now from Redis TIME:
--   0. read t and ts; a missing key is {burst, now}, and so is a key that
--      cannot be read, which is deleted first (reset)
--   1. refill: t = min(burst, t + floor(elapsed_us * rate / 1e6)); a clock
--      that went back (failover) refills nothing and ts never moves back
--   2. t = min(burst, t + returned)
--   3. t = max(-burst, t - consumed)
--   4. granted = min(want, max(t, 0)), rounded down to a multiple of
--      quantum, or 0 if that is below min_grant; t = t - granted (what is
--      left of a quantum stays in the bucket)
--   5. write t and ts, with a TTL that ends when the bucket is full again:
--      ceil((burst - t) * 1000 / rate) ms, at least 1 s, at most 2^43 ms
--      (which keeps it valid on Redis and on miniredis, whose TTLs are
--      time.Duration)
--
-- Lua numbers are doubles, exact for integers below 2^53. Every product
-- below is split so that it stays exact, or is only compared against a bound
-- that is itself exact (a rounded product crosses an exact bound only if the
-- true product does). Numbers written to Redis are formatted with %.0f, which
-- prints every integer below 2^53 in full on Redis and on its test fakes;
-- Lua's own tostring and .. use %.14g, which loses digits from 1e14 on.

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and this
  -- script reads TIME before it writes. Later versions always replicate
  -- effects and accept the call.
  redis.replicate_commands()
end

local MAX_LIMIT = 1125899906842624   -- 2^50
local MAX_AMOUNT = 9007199254740991  -- 2^53 - 1
local MAX_TTL_MS = 8796093022208     -- 2^43 ms, about 278 years
local EXACT = 9007199254740992       -- 2^53
local MICRO = 1000000

if #KEYS ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 key, got ' .. #KEYS)
end
if #ARGV ~= 7 then
  return redis.error_reply('ERR hybrid: want 7 arguments (rate, burst, consumed, returned, want, min_grant, quantum), got ' .. #ARGV)
end

local names = {'rate', 'burst', 'consumed', 'returned', 'want', 'min_grant', 'quantum'}
local arg = {}
for i = 1, 7 do
  local lo, hi = 0, MAX_AMOUNT
  if i <= 2 or i == 7 then
    lo, hi = 1, MAX_LIMIT
  end
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < lo or v > hi or v ~= math.floor(v) then
    return redis.error_reply('ERR hybrid: ' .. names[i] .. ' ' .. tostring(ARGV[i]) ..
      ' is not an integer in [' .. string.format('%.0f', lo) .. ', ' .. string.format('%.0f', hi) .. ']')
  end
  arg[i] = v
end
local rate, burst, consumed, returned, want, min_grant, quantum =
  arg[1], arg[2], arg[3], arg[4], arg[5], arg[6], arg[7]

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])

-- 0. The state. Anything unreadable is replaced by a full bucket rather
-- than left stuck: a key of another type (WRONGTYPE, say after a SET on it)
-- and a hash whose fields are not the script's. pcall, so that WRONGTYPE is
-- seen here; any other error is passed on.
local reset = 0
local t, ts
local state = redis.pcall('HMGET', key, 't', 'ts')
if state.err then
  if not string.find(state.err, 'WRONGTYPE', 1, true) then
    return redis.error_reply(state.err)
  end
  reset = 1
else
  t, ts = tonumber(state[1]), tonumber(state[2])
  if t == nil or ts == nil or t ~= t or ts ~= ts or t ~= math.floor(t) or
      ts ~= math.floor(ts) or ts < 0 or ts > MAX_AMOUNT then
    -- Missing (a full bucket, not a reset) unless the hash exists with
    -- other fields, or with a field that is there but unreadable.
    if state[1] or state[2] or redis.call('EXISTS', key) == 1 then
      reset = 1
    end
    t, ts = nil, nil
  end
end
if t == nil then
  if reset == 1 then
    redis.call('DEL', key)
  end
  t, ts = burst, now
end
if t > burst then
  t = burst -- the burst was lowered since the last write
elseif t < -burst then
  t = -burst
end

-- 1. Refill for the time since ts. elapsed_us * rate may pass 2^53, so with
-- elapsed = es s + eu us and rate = rq * 1e6 + rr:
--   elapsed * rate / 1e6 = es * rate + eu * rq + eu * rr / 1e6
-- es * rate is compared with the deficit first (an exact bound, below 2^51);
-- below it, it is exact. eu * rq < 2^50 and eu * rr < 1e12 are exact, and
-- the floor of eu * rr / 1e6 is right because the quotient is at least 1e-6
-- away from the next integer.
if now > ts then
  local deficit = burst - t
  if deficit > 0 then
    local e = now - ts
    local es = math.floor(e / MICRO)
    local eu = e - es * MICRO
    if eu < 0 then
      es, eu = es - 1, eu + MICRO
    elseif eu >= MICRO then
      es, eu = es + 1, eu - MICRO
    end
    local add = es * rate
    if add < deficit then
      local rq = math.floor(rate / MICRO)
      local rr = rate - rq * MICRO
      add = add + eu * rq + math.floor(eu * rr / MICRO)
    end
    if add >= deficit then
      t = burst
    else
      t = t + add
    end
  end
  ts = now
end

-- 2. Allowance given back. A sum past 2^53 rounds to a value still >= burst.
t = t + returned
if t > burst then
  t = burst
end

-- 3. Consumption charged; debt never sinks below -burst.
t = t - consumed
if t < -burst then
  t = -burst
end

-- 4. Grant a whole number of quanta; the rest of a quantum stays in t.
-- math.fmod of two doubles is exact, and granted >= 0.
local granted = 0
if t > 0 then
  granted = math.min(want, t)
end
granted = granted - math.fmod(granted, quantum)
if granted < min_grant then
  granted = 0
end
t = t - granted

-- 5. Write, with a TTL that ends when the bucket is full again:
-- ceil((burst - t) * 1000 / rate) ms after ts. The quotient is exact up to
-- the ceiling when the numerator is below 2^53; above, one more ms keeps the
-- key from expiring (and so reading as full) too early.
local num = (burst - t) * 1000
local ttl = math.ceil(num / rate)
if num >= EXACT then
  ttl = ttl + 1
end
if ts > now then
  ttl = ttl + math.ceil((ts - now) / 1000)
end
if ttl < 1000 then
  ttl = 1000
elseif ttl > MAX_TTL_MS then
  ttl = MAX_TTL_MS
end
redis.call('HSET', key, 't', string.format('%.0f', t), 'ts', string.format('%.0f', ts))
redis.call('PEXPIRE', key, string.format('%.0f', ttl))

return {granted, t, now, reset}
