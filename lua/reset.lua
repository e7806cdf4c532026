-- reset.lua: a token bucket full again, whatever it held: an operator's
-- reset of one key (a user unblocked), and a mark that keeps the charges of
-- what was spent before it from sinking the new bucket.
--
-- KEYS[1]  a bucket as settle.lua keeps it, e.g. "hybrid:{user42}"
-- ARGV     grace_ms, keep_ms, integers in [1, 2^40], grace_ms <= keep_ms:
--            grace_ms  how long the charges settle.lua makes take from the
--                      bucket down to 0 at most, never into debt: the
--                      instances' rounds charge what they spent before the
--                      reset within it
--            keep_ms   how long the mark is kept: until then a charge of an
--                      outage that began before the reset (settle.lua's
--                      since) takes down to 0 at most, whenever it comes
-- returns  {now_us}: the Redis time of the reset
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV, before anything is
--          written.
--
-- The step, with now from Redis TIME: DEL KEYS[1] (its records of
-- settlements go with it: one sent again is applied as new, and charged as
-- any charge of the grace is), then HSET t = 2^50 (every script caps t at
-- its own burst: full under any limit), ts = now and z = "<now> <now +
-- grace> <now + keep>" in microseconds, and PEXPIRE keep_ms.

local MAX_MS = 1099511627776 -- 2^40 ms, about 35 years
local MICRO = 1000000

if #KEYS ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 key, got ' .. #KEYS)
end
if #ARGV ~= 2 then
  return redis.error_reply('ERR hybrid: want 2 arguments (grace_ms, keep_ms), got ' .. #ARGV)
end
local ms = {}
for i, name in ipairs({'grace_ms', 'keep_ms'}) do
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < 1 or v > MAX_MS or v ~= math.floor(v) then
    return redis.error_reply('ERR hybrid: ' .. name .. ' ' .. tostring(ARGV[i]) ..
      ' is not an integer in [1, 2^40]')
  end
  ms[i] = v
end
if ms[1] > ms[2] then
  return redis.error_reply('ERR hybrid: grace_ms ' .. ARGV[1] .. ' is above keep_ms ' .. ARGV[2])
end

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and this
  -- script reads TIME before it writes.
  redis.replicate_commands()
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])
local format = string.format
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', '1125899906842624', 'ts', format('%.0f', now),
  'z', format('%.0f %.0f %.0f', now, now + ms[1] * 1000, now + ms[2] * 1000))
redis.call('PEXPIRE', KEYS[1], format('%.0f', ms[2]))
return {now}
