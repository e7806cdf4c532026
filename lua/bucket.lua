-- bucket.lua: the opening that peek.lua and ahead.lua share, put in their
-- place by package lua (at their line "--[[bucket.lua]]"): it checks KEYS and
-- ARGV, reads Redis TIME and the bucket in KEYS[1], and refills it, as
-- settle.lua does, to the micro-token.
--
-- Before it, the script sets ARGS, its ARGV in order: {name, lo} for an
-- integer in [lo, 2^50] each, rate and burst first, or {name, lo, i} for one
-- that may not be above the i-th. After it, the script has
--   A          the ARGV, as numbers
--   rate       A[1], micro-tokens per second
--   burst      A[2], micro-tokens
--   now        Redis TIME in microseconds
--   t, ts      the bucket's micro-tokens at now, in [-2^50, burst], and the
--              time they are counted at: now, or later if the clock went
--              back (a failover: the bucket refills nothing and ts never
--              moves back)
--   hash       true if the key is a hash whose t and ts were read (a write
--              keeps its other fields); false for a string, a missing key,
--              or anything settle.lua would replace with a full bucket
--              (another type, a string that is not "<t> <ts>", a hash whose
--              t or ts is unreadable), which reads as full
--   zkeep      for a hash with a reset's mark (reset.lua), until when the
--              mark is kept (a write's TTL lasts that long at least); else
--              nil
-- and the constants and functions declared here. Errors ("ERR hybrid: ...")
-- for bad KEYS or ARGV come before anything is read; an error of Redis
-- itself (not WRONGTYPE) is passed on.

local MAX_LIMIT = 1125899906842624   -- 2^50
local MAX_AMOUNT = 9007199254740991  -- 2^53 - 1
local MICRO = 1000000

local floor, ceil, find, match, format = math.floor, math.ceil, string.find, string.match, string.format
local tonumber, tostring = tonumber, tostring

if #KEYS ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 key, got ' .. #KEYS)
end
if #ARGV ~= #ARGS then
  local names = {}
  for i, a in ipairs(ARGS) do
    names[i] = a[1]
  end
  return redis.error_reply('ERR hybrid: want ' .. #ARGS .. ' arguments (' ..
    table.concat(names, ', ') .. '), got ' .. #ARGV)
end
local A = {}
for i, a in ipairs(ARGS) do
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < a[2] or v > MAX_LIMIT or v ~= floor(v) then
    return redis.error_reply('ERR hybrid: ' .. a[1] .. ' ' .. tostring(ARGV[i]) ..
      ' is not an integer in [' .. a[2] .. ', 2^50]')
  end
  if a[3] and v > A[a[3]] then
    return redis.error_reply('ERR hybrid: ' .. a[1] .. ' ' .. tostring(ARGV[i]) ..
      ' is above ' .. ARGS[a[3]][1] .. ' ' .. tostring(ARGV[a[3]]))
  end
  A[i] = v
end
local rate, burst = A[1], A[2]

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and a
  -- script that reads TIME may write after it.
  redis.replicate_commands()
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])

-- The state, as settle.lua reads it. pcall, so that WRONGTYPE is seen here.
local t, ts, zkeep
local hash = false
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' then
  t, ts = match(v, '^(%-?%d+) (%d+)$')
  t, ts = tonumber(t), tonumber(ts)
elseif v and not find(v.err, 'WRONGTYPE', 1, true) then
  return redis.error_reply(v.err)
elseif v then
  local state = redis.pcall('HMGET', KEYS[1], 't', 'ts', 'z')
  if state.err then
    if not find(state.err, 'WRONGTYPE', 1, true) then
      return redis.error_reply(state.err)
    end
  else
    t, ts = tonumber(state[1]), tonumber(state[2])
    hash = true
    if state[3] then
      zkeep = tonumber(match(state[3], '^%d+ %d+ (%d+)$'))
    end
  end
end
if t == nil or ts == nil or t % 1 ~= 0 or ts % 1 ~= 0 or not (ts >= 0 and ts <= MAX_AMOUNT) then
  t, ts, hash = burst, now, false -- a full bucket
end
if t > burst then
  t = burst -- the burst was lowered since the last write
elseif t < -MAX_LIMIT then
  t = -MAX_LIMIT -- deeper than any debt: not the script's
end
-- Refill from ts to now with settle.lua's gain, written in the main chunk (a
-- function would be a closure made again at every call): the micro-tokens
-- rate refills in e = es s + eu us, exact; beyond MAX_AMOUNT it only needs
-- to reach the deficit, below 2^51.
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
