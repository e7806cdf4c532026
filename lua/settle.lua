-- settle.lua: one step of an authoritative token bucket, in Redis, for each
-- of up to 1000 keys.
--
-- It serves both a settlement round (charge what was spent, take back what
-- was not, grant what is wanted next) and the exact limiter (grant all of a
-- cost or nothing). A call that names its instance and a sequence number is
-- idempotent: sent again after its reply was lost, it is not applied twice.
-- One call may carry many keys (on a Redis Cluster, of one slot), each with
-- arguments and a reply of its own: it costs Redis about half as much a key
-- as a call a key.
--
-- KEYS     1 to 1000 buckets, each a key such as "hybrid:{user42}": a hash
--          with fields
--            t             tokens, in micro-tokens, in [-burst, burst]
--            ts            the Redis time of t, in microseconds
--            q:<instance>  "<seq> <granted> <now_us>": the last call of
--                          that instance applied to this key, what it
--                          granted and the Redis time it was applied at
--            p             the number of fields after the last prune
--          A missing key is a full bucket with no records. A key that holds
--          another type, or a hash whose t or ts is unreadable (whatever
--          other fields it has), is deleted and replaced by a full bucket
--          (reset = 1 in the reply): it never stays stuck. An unreadable
--          q: record counts as no record, and an unreadable or missing p as
--          0; neither is a reset.
-- ARGV     for one key: rate, burst, consumed, returned, want, min_grant,
--          quantum and, to de-duplicate, instance and seq (7 or 9
--          arguments); for more keys, the 9 arguments of each in the order
--          of KEYS, where instance "" and seq 0 stand for no de-duplication;
--          or the 9 arguments of each key and then the string "all": all or
--          nothing, for decisions alone (consumed and returned 0, no seq,
--          each key once): if one key's bucket cannot grant its min_grant,
--          no key is granted anything (each is written as a call that
--          wants nothing would write it)
--            rate       micro-tokens per second, an integer in [1, 2^50]
--            burst      micro-tokens, an integer in [1, 2^50]
--            consumed   micro-tokens spent elsewhere, to charge (>= 0)
--            returned   micro-tokens granted before and not spent (>= 0)
--            want       micro-tokens wanted now (>= 0)
--            min_grant  grant nothing rather than less than this (>= 0)
--            quantum    micro-tokens; the grant is a whole number of these,
--                       an integer in [1, 2^50] (1 does not round)
--            instance   who sends the call: 1 to 64 bytes of [0-9A-Za-z_.-]
--            seq        the call's sequence number, an integer in [1, 2^53)
--          consumed, returned, want and min_grant are integers below 2^53.
--          Without instance and seq every call is applied.
-- returns  {granted, tokens, now_us, reset, dup} for each key, in the
--          order of KEYS, all integers (5 for one key, 5 * #KEYS in all):
--            granted    micro-tokens granted: 0, or in [min_grant, want],
--                       a multiple of quantum; for a duplicate, what the
--                       call with the same seq granted, or 0 (see below)
--            tokens     micro-tokens left after the step, in [-burst, burst]
--            now_us     Redis TIME in microseconds
--            reset      1 if KEYS[1] held something unreadable (another
--                       type, garbled fields) and was replaced, else 0
--            dup        1 if the call was a duplicate and changed nothing,
--                       else 0; never 1 with reset 1
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV (any key's), before
--          anything is read. An error from Redis itself ends the call, and
--          the keys before it may have been written.
--
-- One step for each key in turn, with now from one Redis TIME for all:
--   0. read t, ts, p and the record q:<instance> (one HMGET); a missing key
--      is {burst, now} with no records, and so is a key that cannot be
--      read, which is deleted first (reset); a hash of none of those
--      fields reads as missing, and is deleted and written again after
--      step 5 (reset), when HLEN shows fields besides those written
--   1. refill: t = min(burst, t + floor(elapsed_us * rate / 1e6)); a clock
--      that went back (failover) refills nothing and ts never moves back
--   *. a duplicate (below) stops here: it writes nothing and replies the
--      tokens of step 1, dup = 1
--   2. t = min(burst, t + returned)
--   3. t = max(-burst, t - consumed)
--   4. granted = min(want, max(t, 0)), rounded down to a multiple of
--      quantum, or 0 if that is below min_grant; t = t - granted (what is
--      left of a quantum stays in the bucket)
--   5. write t and ts, and with a seq the record
--      q:<instance> = "<seq> <granted> <now>", in one HSET; with a record,
--      prune (below);
--      set a TTL that ends when the bucket is full again:
--      ceil((burst - t) * 1000 / rate) ms, at least 1 s, at most 2^43 ms
--      (which keeps it valid on Redis and on miniredis, whose TTLs are
--      time.Duration)
--
-- Duplicates. A caller that sends instance and seq promises that the seqs
-- of one instance only increase (one counter over all keys), that a call it
-- sends again is the same call byte for byte, and that it sends nothing for
-- a key with a higher seq while a call for that key with a lower seq is in
-- doubt (sent, no reply): it sends that one again first. With rec the
-- record of the instance on the key:
--   no rec, or seq > rec.seq  applied (steps 2 to 5), rec = {seq, granted,
--                             now}
--   seq == rec.seq            a duplicate: granted = rec.granted
--   seq < rec.seq             a duplicate of a call superseded since:
--                             granted = 0
-- A key that is missing (expired, flushed, lost) or reset has no records,
-- so any seq is applied: the state it would duplicate is gone. Such a
-- bucket is full (a key expires only once its bucket is full again), so a
-- call applied twice that way charges consumed twice and loses the first
-- grant, which errs towards denying; what it returns is capped away.
--
-- Pruning, so that a hot key that never expires does not collect the
-- records of instances long gone. After the HSET of step 5 of a call with a
-- seq (the only calls that add fields), if HLEN is
-- above max(2 * p, 64) (or below p, which no prune leaves), every q: record
-- whose now_us is more than 10 minutes before now, or that is unreadable,
-- is deleted, and p is set to the number of fields left (p included):
-- amortised O(1) per call. A call sent again more than 10 minutes after it
-- was applied may find its record pruned and be applied twice: consumed is
-- charged twice and the first grant is lost (towards denying), but returned
-- is given back twice unless the bucket is full (towards admitting, by at
-- most returned). A caller should not send a call again verbatim that long
-- after it first sent it.
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
local MAX_INSTANCE = 64              -- bytes
local MAX_KEYS = 1000                -- a call's
local PRUNE_AGE_US = 600000000       -- 10 minutes
local PRUNE_MIN = 64                 -- fields
local HDEL_CHUNK = 1000              -- fields per HDEL, well inside unpack's limit

-- Locals for the library functions a step calls: a global lookup for each
-- use costs more than the arithmetic, a thousand keys a call.
local floor, ceil, fmod, mmin, mmax = math.floor, math.ceil, math.fmod, math.min, math.max
local format, find, match, sub = string.format, string.find, string.match, string.sub
local tonumber, tostring, unpack = tonumber, tostring, unpack
local rcall, rpcall = redis.call, redis.pcall

-- check reads and checks the n arguments (7 or 9) of one key that start
-- after ARGV[base], as the header says, and stores them in A from
-- A[base + 1]: the seven numbers, then the instance and seq, or false and
-- false for none. It returns what is wrong, or nil. With 9, instance "" and
-- seq 0 are no de-duplication only if empty is true (a call of many keys).
local A = {}
local nowString -- now, formatted once for every key's ts (on first use)
-- Numbers read already, limits and amounts apart (their bounds differ), for
-- a call of many keys: they share most of their arguments (a limit, a
-- cost, zeros), and a table lookup of a string costs less than tonumber.
-- A call of one key has no use for them.
local limits, amounts
local function check(base, n, empty)
  for i = 1, 7 do
    local a = ARGV[base + i]
    local lo, hi, known = 0, MAX_AMOUNT, amounts
    if i <= 2 or i == 7 then
      lo, hi, known = 1, MAX_LIMIT, limits
    end
    local v
    if known then
      v = known[a]
    end
    if v == nil then
      v = tonumber(a)
      if v == nil or v ~= v or v < lo or v > hi or v ~= floor(v) then
        local names = {'rate', 'burst', 'consumed', 'returned', 'want', 'min_grant', 'quantum'}
        return names[i] .. ' ' .. tostring(a) .. ' is not an integer in [' ..
          format('%.0f', lo) .. ', ' .. format('%.0f', hi) .. ']'
      end
      if known then
        known[a] = v
      end
    end
    A[base + i] = v
  end
  A[base + 8], A[base + 9] = false, false
  if n < 9 then
    return nil
  end
  local instance, seq = ARGV[base + 8], ARGV[base + 9]
  if empty and instance == '' and seq == '0' then
    return nil
  end
  if #instance < 1 or #instance > MAX_INSTANCE or not find(instance, '^[0-9A-Za-z_.%-]+$') then
    return 'instance of ' .. #instance .. ' bytes is not 1 to ' .. MAX_INSTANCE ..
      ' bytes of [0-9A-Za-z_.-]'
  end
  local v = tonumber(seq)
  if v == nil or v ~= v or v < 1 or v > MAX_AMOUNT or v ~= floor(v) then
    return 'seq ' .. tostring(seq) .. ' is not an integer in [1, ' ..
      format('%.0f', MAX_AMOUNT) .. ']'
  end
  A[base + 8], A[base + 9] = instance, v
  return nil
end

-- record parses a q: record "<seq> <granted> <now_us>"; nil if unreadable.
local function record(v)
  if not v then
    return nil
  end
  local s, g, n = match(v, '^(%d+) (%d+) (%d+)$')
  s, g, n = tonumber(s), tonumber(g), tonumber(n)
  if s == nil or g == nil or n == nil or s < 1 or s > MAX_AMOUNT or
      g > MAX_AMOUNT or n > MAX_AMOUNT then
    return nil
  end
  return {seq = s, granted = g, now = n}
end

-- refill returns a bucket of t micro-tokens at Redis time ts, refilled at
-- rate up to burst, at now: its tokens and time.
local function refill(t, ts, now, rate, burst)
  -- elapsed_us * rate may pass 2^53, so with
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
      local es = floor(e / MICRO)
      local eu = e - es * MICRO
      if eu < 0 then
        es, eu = es - 1, eu + MICRO
      elseif eu >= MICRO then
        es, eu = es + 1, eu - MICRO
      end
      local add = es * rate
      if add < deficit then
        local rq = floor(rate / MICRO)
        local rr = rate - rq * MICRO
        add = add + eu * rq + floor(eu * rr / MICRO)
      end
      if add >= deficit then
        t = burst
      else
        t = t + add
      end
    end
    ts = now
  end
  return t, ts
end

-- peek returns the tokens key's bucket holds at now, refilled, for a call
-- whose arguments check stored from A[base + 1], without writing anything:
-- a bucket it cannot read is full, as settle would make it.
local function peek(key, base, now)
  local rate, burst = A[base + 1], A[base + 2]
  local state = rpcall('HMGET', key, 't', 'ts')
  local t, ts
  if not state.err then
    t, ts = tonumber(state[1]), tonumber(state[2])
  end
  if t == nil or ts == nil or t ~= t or ts ~= ts or t ~= floor(t) or
      ts ~= floor(ts) or ts < 0 or ts > MAX_AMOUNT then
    return burst
  end
  t = mmax(mmin(t, burst), -burst)
  t = refill(t, ts, now, rate, burst)
  return t
end

-- settle applies the call whose arguments check stored from A[base + 1] to
-- key at Redis time now, and returns granted, tokens, reset and dup, or nil
-- and an error.
local function settle(key, base, now)
  local rate, burst, consumed, returned, want, min_grant, quantum =
    A[base + 1], A[base + 2], A[base + 3], A[base + 4], A[base + 5], A[base + 6], A[base + 7]
  local instance, seq = A[base + 8], A[base + 9]
  if not instance then
    instance, seq = nil, nil
  end

  -- 0. The state. Anything unreadable is replaced by a full bucket rather
  -- than left stuck: a key of another type (WRONGTYPE, say after a SET on it)
  -- and a hash whose t and ts are not the script's. pcall, so that WRONGTYPE
  -- is seen here; any other error is passed on.
  local reset = 0
  local missing = false -- or a hash of fields other than those read
  local t, ts
  local p, rec = 0, nil
  local rfield = instance and ('q:' .. instance)
  local state
  if rfield then
    state = rpcall('HMGET', key, 't', 'ts', 'p', rfield)
  else
    state = rpcall('HMGET', key, 't', 'ts', 'p')
  end
  if state.err then
    if not find(state.err, 'WRONGTYPE', 1, true) then
      return nil, state.err
    end
    reset = 1
  else
    t, ts = tonumber(state[1]), tonumber(state[2])
    if t == nil or ts == nil or t ~= t or ts ~= ts or t ~= floor(t) or
        ts ~= floor(ts) or ts < 0 or ts > MAX_AMOUNT then
      -- Missing (a full bucket, not a reset) unless the hash exists with
      -- other fields (records, p, anything), or with a field that is there
      -- but unreadable. Fields other than those read are told by the
      -- write: the key is missing if it then holds what was written alone.
      if state[1] or state[2] or state[3] or state[4] then
        reset = 1
      else
        missing = true
      end
      t, ts = nil, nil
    else
      -- Only a readable bucket keeps its records and p.
      local n = tonumber(state[3])
      if n and n == n and n >= 0 and n <= MAX_AMOUNT and n == floor(n) then
        p = n
      end
      if rfield then
        rec = record(state[4])
      end
    end
  end
  if t == nil then
    if reset == 1 then
      rcall('DEL', key)
    end
    t, ts = burst, now
  end
  if t > burst then
    t = burst -- the burst was lowered since the last write
  elseif t < -burst then
    t = -burst
  end

  -- 1. Refill for the time since ts.
  t, ts = refill(t, ts, now, rate, burst)

  -- A duplicate changes nothing: it replies what it was granted the first
  -- time (0 if superseded since) and the tokens as refilled, unwritten.
  if rec and seq <= rec.seq then
    local granted = 0
    if seq == rec.seq then
      granted = rec.granted
    end
    return granted, t, 0, 1
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
  -- fmod of two doubles is exact, and granted >= 0.
  local granted = 0
  if t > 0 then
    granted = mmin(want, t)
  end
  granted = granted - fmod(granted, quantum)
  if granted < min_grant then
    granted = 0
  end
  t = t - granted

  -- 5. Write, with a TTL that ends when the bucket is full again:
  -- ceil((burst - t) * 1000 / rate) ms after ts. The quotient is exact up to
  -- the ceiling when the numerator is below 2^53; above, one more ms keeps the
  -- key from expiring (and so reading as full) too early.
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
  if not nowString then
    nowString = format('%.0f', now)
  end
  local st, sts = format('%.0f', t), nowString
  if ts ~= now then
    sts = format('%.0f', ts)
  end
  local written = 2
  if rfield then
    rcall('HSET', key, 't', st, 'ts', sts, rfield, format('%.0f %.0f %.0f', seq, granted, now))
    written = 3
  else
    rcall('HSET', key, 't', st, 'ts', sts)
  end
  -- A call without a record adds no field to a readable bucket: the hash is
  -- counted only after a record, or for a key that read as missing.
  local fields = written
  if rfield or missing then
    fields = rcall('HLEN', key)
  end
  if missing and fields > written then
    -- A hash of fields that are not the script's: replaced, as unreadable.
    -- The step was the same on a full bucket.
    reset = 1
    rcall('DEL', key)
    if rfield then
      rcall('HSET', key, 't', st, 'ts', sts, rfield, format('%.0f %.0f %.0f', seq, granted, now))
    else
      rcall('HSET', key, 't', st, 'ts', sts)
    end
    fields = written
  end

  -- Prune the records older than PRUNE_AGE_US (and unreadable ones) once the
  -- hash has more than doubled since the last prune: a prune reads every
  -- field, and more than half of them were added since, one record per call.
  -- Fields are only added between prunes, so a p above HLEN is wrong (written
  -- by someone else) and is mended by a prune too.
  if rfield and (fields > mmax(2 * p, PRUNE_MIN) or p > fields) then
    local all = rcall('HGETALL', key)
    local old = {}
    local hasP = false
    for i = 1, #all, 2 do
      local f = all[i]
      if f == 'p' then
        hasP = true
      elseif sub(f, 1, 2) == 'q:' then
        local r = record(all[i + 1])
        if r == nil or r.now < now - PRUNE_AGE_US then
          old[#old + 1] = f
        end
      end
    end
    for i = 1, #old, HDEL_CHUNK do
      rcall('HDEL', key, unpack(old, i, mmin(i + HDEL_CHUNK - 1, #old)))
    end
    fields = fields - #old
    if not hasP then
      fields = fields + 1
    end
    rcall('HSET', key, 'p', format('%.0f', fields))
  end
  rcall('PEXPIRE', key, format('%.0f', ttl))

  return granted, t, reset, 0
end

-- Every call is read and checked before any key is touched: a call of many
-- keys with one bad part changes nothing.
local stride = 9
-- All or nothing: 9 arguments a key and then "all".
local all = #ARGV == 9 * #KEYS + 1 and ARGV[#ARGV] == 'all'
if all then
  if #KEYS == 0 or #KEYS > MAX_KEYS then
    return redis.error_reply('ERR hybrid: want 1 to ' .. MAX_KEYS .. ' keys, got ' .. #KEYS)
  end
  limits, amounts = {}, {}
  local named = {}
  for i = 1, #KEYS do
    local base = 9 * (i - 1)
    local err = check(base, 9, true)
    if not err and (A[base + 3] ~= 0 or A[base + 4] ~= 0 or A[base + 8]) then
      err = 'all or nothing takes decisions alone: no consumed, returned or seq'
    end
    if not err and named[KEYS[i]] then
      err = 'all or nothing takes each key once'
    end
    if err then
      return redis.error_reply('ERR hybrid: key ' .. i .. ': ' .. err)
    end
    named[KEYS[i]] = true
  end
elseif #KEYS == 1 and (#ARGV == 7 or #ARGV == 9) then
  local err = check(0, #ARGV, false)
  if err then
    return redis.error_reply('ERR hybrid: ' .. err)
  end
elseif #KEYS == 1 then
  return redis.error_reply('ERR hybrid: want 7 arguments (rate, burst, consumed, returned, want, min_grant, quantum) or 9 (then instance, seq), got ' .. #ARGV)
elseif #KEYS == 0 or #KEYS > MAX_KEYS then
  return redis.error_reply('ERR hybrid: want 1 to ' .. MAX_KEYS .. ' keys, got ' .. #KEYS)
elseif #ARGV ~= 9 * #KEYS then
  return redis.error_reply('ERR hybrid: want 9 arguments a key for ' .. #KEYS .. ' keys, got ' .. #ARGV)
else
  limits, amounts = {}, {}
  for i = 1, #KEYS do
    local err = check(9 * (i - 1), 9, true)
    if err then
      return redis.error_reply('ERR hybrid: key ' .. i .. ': ' .. err)
    end
  end
end

local time = rcall('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])
if all then
  -- Every key's grant first, from what its bucket holds: if one falls
  -- short of its min_grant, none is granted (each key is written as a call
  -- that wants nothing would write it).
  for i = 1, #KEYS do
    local base = stride * (i - 1)
    local t = peek(KEYS[i], base, now)
    local g = 0
    if t > 0 then
      g = mmin(A[base + 5], t)
    end
    g = g - fmod(g, A[base + 7])
    if g < A[base + 6] then
      for j = 1, #KEYS do
        A[stride * (j - 1) + 5], A[stride * (j - 1) + 6] = 0, 0
      end
      break
    end
  end
end
local out = {}
local o = 0
for i = 1, #KEYS do
  local granted, t, reset, dup = settle(KEYS[i], stride * (i - 1), now)
  if granted == nil then
    return redis.error_reply(t)
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = granted, t, now, reset, dup
  o = o + 5
end
return out
