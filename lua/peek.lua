-- peek.lua: what the token bucket in KEYS[1] holds now, read without
-- writing anything: the answer to "how many tokens are left?", which takes
-- none.
--
-- KEYS[1]  a bucket as settle.lua keeps it: a string "<t> <ts>", or a hash
--          with fields t and ts (micro-tokens, and the Redis time of t in
--          microseconds)
-- ARGV     rate, burst: micro-tokens per second and micro-tokens, integers
--          in [1, 2^50], the limit the bucket is read under
-- returns  {tokens, now_us}, integers: the micro-tokens the bucket holds at
--          Redis TIME now_us, refilled at rate since it was written, in
--          [-2^50, burst]. A missing key is a full bucket (burst), and so is
--          one settle.lua would replace by a full bucket (another type, a
--          string that is not "<t> <ts>", a hash whose t or ts is
--          unreadable): what the next step of the bucket would start from.
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV, before anything is read.
--
-- The refill is settle.lua's, to the micro-token: a peek and a step at the
-- same Redis time see the same bucket. The script reads TIME and then one or
-- two reads of the key (GET, and HMGET only if the key is not a string), and
-- writes nothing, so it may run on a replica (EVALSHA_RO).

local MAX_LIMIT = 1125899906842624   -- 2^50
local MAX_AMOUNT = 9007199254740991  -- 2^53 - 1
local MICRO = 1000000

local floor, find, match = math.floor, string.find, string.match
local tonumber, tostring = tonumber, tostring

if #KEYS ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 key, got ' .. #KEYS)
end
if #ARGV ~= 2 then
  return redis.error_reply('ERR hybrid: want 2 arguments (rate, burst), got ' .. #ARGV)
end
local limits = {}
for i, name in ipairs({'rate', 'burst'}) do
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < 1 or v > MAX_LIMIT or v ~= floor(v) then
    return redis.error_reply('ERR hybrid: ' .. name .. ' ' .. tostring(ARGV[i]) ..
      ' is not an integer in [1, 2^50]')
  end
  limits[i] = v
end
local rate, burst = limits[1], limits[2]

local time = redis.call('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])

-- The state, as settle.lua reads it: nil where it would start from a full
-- bucket. pcall, so that WRONGTYPE is seen here; any other error is passed
-- on.
local t, ts
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
    if t ~= nil and t % 1 ~= 0 then
      t = nil
    end
  end
end
if t == nil or ts == nil or ts % 1 ~= 0 or not (ts >= 0 and ts <= MAX_AMOUNT) then
  return {burst, now}
end
if t > burst then
  t = burst
elseif t < -MAX_LIMIT then
  t = -MAX_LIMIT
end
-- Refill from ts to now (a clock that went back, a failover, refills
-- nothing) with settle.lua's gain, written in the main chunk (a function
-- would be a closure made again at every call): the micro-tokens rate
-- refills in e = es s + eu us, exact; beyond MAX_AMOUNT it only needs to
-- reach the deficit, below 2^51 (see there).
if now > ts and t < burst then
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
return {t, now}
