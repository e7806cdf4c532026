-- witness.lua: an instance's last beat on one Redis node, beside a bucket
-- that node holds, so that the instance can tell when the node lost its
-- writes (a replica that lagged promoted in its place, a restart from an
-- older snapshot). On a single Redis the heartbeat keeps it (heartbeat.lua's
-- KEYS[2]); on a Redis Cluster each master keeps one of its own.
--
-- KEYS[1]  the witness, e.g. "hybrid:{key}:w:<id>" (in the slot of the
--          bucket of key): a string, the Redis time of the instance's last
--          beat there in milliseconds
-- ARGV     keep_ms: how long Redis keeps the beat, an integer in
--          [1, 2^40]; 0 deletes the witness instead (an instance that
--          leaves)
-- returns  {now_ms, was_ms}, integers:
--            now_ms  Redis TIME in milliseconds, rounded down
--            was_ms  the beat before the call, 0 if none (or not an
--                    integer): an instance that finds an older beat than
--                    its last one talks to a node that lost its writes
--                    since
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV, before anything is read.
--
-- One call: was = GET KEYS[1]; SET KEYS[1] now PX keep_ms (DEL KEYS[1] for
-- keep_ms 0). All numbers stay
-- below 2^53 and are written with %.0f.

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and this
  -- script reads TIME before it writes.
  redis.replicate_commands()
end

local MAX_KEEP_MS = 1099511627776 -- 2^40 ms, about 35 years

if #KEYS ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 key, got ' .. #KEYS)
end
if #ARGV ~= 1 then
  return redis.error_reply('ERR hybrid: want 1 argument (keep_ms), got ' .. #ARGV)
end
local keep = tonumber(ARGV[1])
if keep == nil or keep ~= keep or keep < 0 or keep > MAX_KEEP_MS or keep ~= math.floor(keep) then
  return redis.error_reply('ERR hybrid: keep_ms ' .. tostring(ARGV[1]) ..
    ' is not an integer in [0, ' .. string.format('%.0f', MAX_KEEP_MS) .. ']')
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local was = tonumber(redis.call('GET', KEYS[1]))
if was == nil or was ~= was or was < 0 or was ~= math.floor(was) then
  was = 0
end
if keep == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%.0f', now), 'PX', string.format('%.0f', keep))
end

return {now, was}
