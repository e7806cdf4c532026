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
-- The bucket is read and refilled as settle.lua reads and refills it
-- (bucket.lua, below): a peek and a step at the same Redis time see the
-- same bucket. The script reads TIME and then one or two reads of the key
-- (GET, and HMGET only if the key is not a string), and writes nothing, so
-- it may run on a replica (EVALSHA_RO).

local ARGS = {{'rate', 1}, {'burst', 1}}
--[[bucket.lua]]
return {t, now}
