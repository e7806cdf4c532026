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
-- KEYS     1 to 1000 buckets, each a key such as "hybrid:{user42}", in one
--          of two forms. A bucket no call with a seq has touched is a
--          string "<t> <ts>" (integers in decimal, t may be negative): one
--          command reads it, one writes it with its TTL. Once a call with a
--          seq writes it, it is a hash with fields
--            t             tokens, in micro-tokens, in [-2^50, burst]
--            ts            the Redis time of t, in microseconds
--            q:<instance>  "<seq> <granted> <now_us>": the last call of
--                          that instance applied to this key, what it
--                          granted and the Redis time it was applied at
--            p             the number of fields after the last prune
--            o             "<pool> <end_us>": an outage's pool (see
--                          since), while some of it is left
--            z             "<at_us> <grace_end_us> <keep_end_us>": the
--                          mark of a reset (reset.lua), kept until
--                          keep_end_us at least
--          and stays one until it expires (a call without a seq keeps its
--          records). A missing key is a full bucket with no records. A key
--          that holds another type, a string that is not "<t> <ts>", or a
--          hash whose t or ts is unreadable (whatever other fields it has),
--          is replaced by a full bucket (reset = 1 in the reply): it never
--          stays stuck. An unreadable q: record counts as no record, and an
--          unreadable or missing p as 0; neither is a reset.
-- ARGV     for one key: rate, burst, consumed, returned, want, min_grant,
--          quantum, debt and, to de-duplicate, instance and seq, and then
--          for an outage's charge since and claim (8, 10 or 12 arguments);
--          for more keys, the 10 or 12 arguments of each in the order of
--          KEYS, where instance "" and seq 0 stand for no de-duplication
--          (and since 0, claim 0 for no outage);
--          or the 10 arguments of each key and then the string "all": all or
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
--            debt       micro-tokens the bucket may owe at most: a charge
--                       never sinks it below -debt (one below it already,
--                       under a larger debt, stays where it is), an
--                       integer in [0, 2^50]
--            instance   who sends the call: 1 to 64 bytes of [0-9A-Za-z_.-]
--            seq        the call's sequence number, an integer in [1, 2^53)
--            since      the Redis time, in microseconds, at which the
--                       outage whose admissions consumed charges began
--                       (0: none), an integer in [0, 2^53); needs a seq
--            claim      micro-tokens of consumed not to charge out of the
--                       outage's pool (0 without a since), an integer in
--                       [0, consumed]: the refill the caller's own share
--                       of the bucket kept during the outage because it
--                       was spent below its burst (what a bucket that saw
--                       those admissions would have kept too)
--          consumed, returned, want and min_grant are integers below 2^53.
--          Without instance and seq every call is applied.
-- returns  {granted, tokens, now_us, reset, dup, forgiven, credited} for
--          each key, in the order of KEYS, all integers (7 for one key,
--          7 * #KEYS in all):
--            granted    micro-tokens granted: 0, or in [min_grant, want],
--                       a multiple of quantum; for a duplicate, what the
--                       call with the same seq granted, or 0 (see below)
--            tokens     micro-tokens left after the step, in [-2^50, burst]
--            now_us     Redis TIME in microseconds
--            reset      1 if KEYS[1] held something unreadable (another
--                       type, garbled fields) and was replaced, else 0
--            dup        1 if the call was a duplicate and changed nothing,
--                       2 if it was one of a call superseded since (a
--                       lower seq than the instance's last: it may never
--                       have been applied), else 0; never more than 0
--                       with reset 1
--            forgiven   micro-tokens of consumed that step 3 did not charge,
--                       the bucket being at -debt (or below) already: in
--                       [0, consumed], 0 for a duplicate
--            credited   micro-tokens of consumed that step 2b did not
--                       charge, out of the outage's pool: in [0, claim],
--                       0 for a duplicate (the bucket took consumed less
--                       credited less forgiven)
-- errors   "ERR hybrid: ..." for bad KEYS or ARGV (any key's), before
--          anything is read. An error from Redis itself ends the call, and
--          the keys before it may have been written.
--
-- One step for each key in turn, with now from one Redis TIME for all:
--   0. read the bucket: without a seq, GET, and only if the key holds
--      another type, HMGET t, ts, p; with a seq, HMGET t, ts, p and the
--      record q:<instance>, and only if the key holds another type, GET. A
--      missing key is {burst, now} with no records, and so is a key that
--      cannot be read (reset). With a seq, a hash of none of those fields
--      reads as missing, and is deleted and written again after step 5
--      (reset), when HLEN shows fields besides those written; without one,
--      such a hash (the key exists: GET said so) is a reset at once
--   1. refill: t = min(burst, t + floor(elapsed_us * rate / 1e6)); a clock
--      that went back (failover) refills nothing and ts never moves back
--   *. a duplicate (below) stops here: it writes nothing and replies the
--      tokens of step 1, dup = 1 (2 if superseded)
--   2. t = min(burst, t + returned)
--  2b. with a since: the pool (o) is opened if the bucket was last
--      written at or before since, with the refill step 1 lost at the
--      burst since then (nobody wrote it through the outage, so none of the
--      outage's admissions were in it: a bucket that saw them would have
--      kept that refill), or if the key was missing (it expired once full),
--      with the refill since since less the burst (what it lost had it
--      held nothing then: a bucket in use); else the pool an earlier call opened is the call's if that
--      call came after since (its outage overlapped the gap), else there is
--      none. credit = min(claim, pool) is taken out of consumed and out of
--      the pool, which is written back while some is left (deleted once
--      drawn). A bucket written through this call's outage has no pool
--      for it: a charge of a partial outage is charged in full
--   3. t = max(min(t, -debt), t - consumed); forgiven = what max dropped;
--      with 0 for -debt while a reset's grace lasts, and for a charge whose
--      outage began before the reset (since < at): what was spent before
--      a reset takes from the new bucket, never into debt
--   4. granted = min(want, max(t, 0)), rounded down to a multiple of
--      quantum, or 0 if that is below min_grant; t = t - granted (what is
--      left of a quantum stays in the bucket)
--   5. write the bucket with a TTL that ends when it is full again:
--      ceil((burst - t) * 1000 / rate) ms, at least 1 s (and at least
--      until a reset's keep_end), at most 2^43 ms
--      (which keeps it valid on Redis and on miniredis, whose TTLs are
--      time.Duration). Without a seq, and unless the key is a readable
--      hash, as a string: SET "<t> <ts>" PX ttl, which replaces whatever
--      the key held. Otherwise as a hash (a key of another type is deleted
--      first): t, ts and, with a seq, the record
--      q:<instance> = "<seq> <granted> <now>", in one HSET; with a record,
--      prune (below); then PEXPIRE
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
--                             granted = 0, dup = 2
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
-- Lua's own tostring and .. use %.14g, which loses digits from 1e14 on. The
-- TTL (below 2^43) is passed as a number: Redis and miniredis convert an
-- integer argument in full.

if redis.replicate_commands then
  -- Redis < 5 replicates scripts verbatim unless told otherwise, and this
  -- script reads TIME before it writes. Later versions always replicate
  -- effects and accept the call.
  redis.replicate_commands()
end

-- The work of a key is written out in the main chunk, not in functions:
-- each function is a closure made again on every call, at a cost that grows
-- with the locals it captures (about 1.5 microseconds for the five this
-- script had), more than a call of one key spends on its arithmetic.

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

local floor, ceil, fmod, mmin = math.floor, math.ceil, math.fmod, math.min
local format, find, match, sub = string.format, string.find, string.match, string.sub
local tonumber, tostring, unpack = tonumber, tostring, unpack
local rcall, rpcall = redis.call, redis.pcall
local KEYS, ARGV = KEYS, ARGV
local nkeys, nargs = #KEYS, #ARGV

-- The form of the call: its arguments a key (stride), all or nothing, and
-- whether instance "" and seq 0 stand for no de-duplication (empty).
local all = nargs == 10 * nkeys + 1 and ARGV[nargs] == 'all'
local stride, empty = 10, true
if all then
  if nkeys == 0 or nkeys > MAX_KEYS then
    return redis.error_reply('ERR hybrid: want 1 to ' .. MAX_KEYS .. ' keys, got ' .. nkeys)
  end
elseif nkeys == 1 and (nargs == 8 or nargs == 10 or nargs == 12) then
  stride, empty = nargs, false
elseif nkeys == 1 then
  return redis.error_reply('ERR hybrid: want 8 arguments (rate, burst, consumed, returned, want, min_grant, quantum, debt), 10 (then instance, seq) or 12 (then since, claim), got ' .. nargs)
elseif nkeys == 0 or nkeys > MAX_KEYS then
  return redis.error_reply('ERR hybrid: want 1 to ' .. MAX_KEYS .. ' keys, got ' .. nkeys)
elseif nargs == 12 * nkeys then
  stride = 12
elseif nargs ~= 10 * nkeys then
  return redis.error_reply('ERR hybrid: want 10 or 12 arguments a key for ' .. nkeys .. ' keys, got ' .. nargs)
end

-- Every call is read and checked before any key is touched: a call of many
-- keys with one bad part changes nothing. A holds the numbers of key i from
-- A[stride * (i - 1) + 1]: the eight numbers, then the instance and seq, or
-- false and false for none. SINCE[i] and CLAIM[i] are key i's since and
-- claim, nil when the call has none (a call of 8 or 10 arguments a key).
local A = {}
local SINCE, CLAIM = {}, {}
-- Numbers read already, limits, amounts and debts apart (their bounds
-- differ), for a call of many keys: they share most of their arguments (a
-- limit, a cost, zeros), and a table lookup of a string costs less than
-- tonumber. A call of one key has no use for them.
local limits, amounts, debts
if nkeys > 1 then
  limits, amounts, debts = {}, {}, {}
end
local named = all and {} -- the keys of an all or nothing call
local valid -- the instance checked last, when it was valid
for i = 1, nkeys do
  local base = stride * (i - 1)
  local err
  for j = 1, 8 do
    local a = ARGV[base + j]
    local limit = j <= 2 or j == 7
    local known = amounts
    if limit then
      known = limits
    elseif j == 8 then
      known = debts
    end
    local v = known and known[a]
    if v == nil then
      local lo, hi = 0, MAX_AMOUNT
      if limit then
        lo, hi = 1, MAX_LIMIT
      end
      if j == 8 then
        hi = MAX_LIMIT
      end
      v = tonumber(a)
      -- Not a number, NaN, out of bounds, or not an integer.
      if v == nil or not (v >= lo and v <= hi) or v % 1 ~= 0 then
        local names = {'rate', 'burst', 'consumed', 'returned', 'want', 'min_grant', 'quantum', 'debt'}
        err = names[j] .. ' ' .. tostring(a) .. ' is not an integer in [' ..
          format('%.0f', lo) .. ', ' .. format('%.0f', hi) .. ']'
        break
      end
      if known then
        known[a] = v
      end
    end
    A[base + j] = v
  end
  A[base + 9], A[base + 10] = false, false
  if not err and stride >= 10 then
    local instance, seq = ARGV[base + 9], ARGV[base + 10]
    if not (empty and instance == '' and seq == '0') then
      if instance ~= valid then
        if #instance < 1 or #instance > MAX_INSTANCE or not find(instance, '^[0-9A-Za-z_.%-]+$') then
          err = 'instance of ' .. #instance .. ' bytes is not 1 to ' .. MAX_INSTANCE ..
            ' bytes of [0-9A-Za-z_.-]'
        else
          valid = instance
        end
      end
      if not err then
        local v = tonumber(seq)
        if v == nil or not (v >= 1 and v <= MAX_AMOUNT) or v % 1 ~= 0 then
          err = 'seq ' .. tostring(seq) .. ' is not an integer in [1, ' ..
            format('%.0f', MAX_AMOUNT) .. ']'
        else
          A[base + 9], A[base + 10] = instance, v
        end
      end
    end
  end
  if not err and stride == 12 then
    local since, claim = tonumber(ARGV[base + 11]), tonumber(ARGV[base + 12])
    if since == nil or not (since >= 0 and since <= MAX_AMOUNT) or since % 1 ~= 0 then
      err = 'since ' .. tostring(ARGV[base + 11]) .. ' is not an integer in [0, ' ..
        format('%.0f', MAX_AMOUNT) .. ']'
    elseif claim == nil or not (claim >= 0 and claim <= A[base + 3]) or claim % 1 ~= 0 then
      err = 'claim ' .. tostring(ARGV[base + 12]) .. ' is not an integer in [0, consumed]'
    elseif since > 0 and not A[base + 9] then
      err = 'since needs an instance and seq'
    elseif claim > 0 and since == 0 then
      err = 'claim needs a since'
    else
      SINCE[i], CLAIM[i] = since, claim
    end
  end
  if all and not err then
    if A[base + 3] ~= 0 or A[base + 4] ~= 0 or A[base + 9] then
      err = 'all or nothing takes decisions alone: no consumed, returned or seq'
    elseif named[KEYS[i]] then
      err = 'all or nothing takes each key once'
    end
    named[KEYS[i]] = true
  end
  if err then
    if empty then
      return redis.error_reply('ERR hybrid: key ' .. i .. ': ' .. err)
    end
    return redis.error_reply('ERR hybrid: ' .. err)
  end
end

-- gain returns the micro-tokens a bucket refills in e microseconds (e >= 0)
-- at rate, uncapped, at most MAX_AMOUNT. e * rate may pass 2^53, so with
-- e = es s + eu us and rate = rq * 1e6 + rr:
--   e * rate / 1e6 = es * rate + eu * rq + eu * rr / 1e6
-- es * rate is compared with MAX_AMOUNT first (a rounded product crosses an
-- exact bound only if the true one does); below it, it is exact. eu * rq <
-- 2^50 and eu * rr < 1e12 are exact, and the floor of eu * rr / 1e6 is
-- right because the quotient is at least 1e-6 away from the next integer.
local function gain(e, rate)
  local es = floor(e / MICRO)
  local eu = e - es * MICRO
  if eu < 0 then
    es, eu = es - 1, eu + MICRO
  elseif eu >= MICRO then
    es, eu = es + 1, eu - MICRO
  end
  local add = es * rate
  if add >= MAX_AMOUNT then
    return MAX_AMOUNT
  end
  local rq = floor(rate / MICRO)
  local rr = rate - rq * MICRO
  add = add + eu * rq + floor(eu * rr / MICRO)
  if add > MAX_AMOUNT then
    return MAX_AMOUNT
  end
  return add
end

-- refill returns a bucket of t micro-tokens at Redis time ts, refilled at
-- rate up to burst, at now: its tokens and time. The deficit is below
-- 2^51, so a gain capped at MAX_AMOUNT compares with it exactly.
local function refill(t, ts, now, rate, burst)
  if now > ts then
    if t < burst then
      local add = gain(now - ts, rate)
      if add >= burst - t then
        t = burst
      else
        t = t + add
      end
    end
    ts = now
  end
  return t, ts
end

-- record parses a q: record "<seq> <granted> <now_us>" into its three
-- numbers; nil if unreadable.
local function record(v)
  local s, g, n = match(v, '^(%d+) (%d+) (%d+)$')
  s, g, n = tonumber(s), tonumber(g), tonumber(n)
  if s and g and n and s >= 1 and s <= MAX_AMOUNT and g <= MAX_AMOUNT and n <= MAX_AMOUNT then
    return s, g, n
  end
  return nil
end

-- bucket parses a bucket kept as a string "<t> <ts>" into its two
-- numbers; nil if unreadable.
local function bucket(v)
  local t, ts = match(v, '^(%-?%d+) (%d+)$')
  t, ts = tonumber(t), tonumber(ts)
  if t and ts and ts <= MAX_AMOUNT then
    return t, ts
  end
  return nil
end

-- mark parses a reset's mark "<at> <grace_end> <keep_end>" (reset.lua) into
-- its three times; nil if unreadable.
local function mark(v)
  local a, g, k = match(v, '^(%d+) (%d+) (%d+)$')
  a, g, k = tonumber(a), tonumber(g), tonumber(k)
  if a and g and k and a <= MAX_AMOUNT and g <= MAX_AMOUNT and k <= MAX_AMOUNT then
    return a, g, k
  end
  return nil
end

local time = rcall('TIME')
local now = tonumber(time[1]) * MICRO + tonumber(time[2])

if all then
  -- Every key's grant first, from what its bucket holds at now, refilled
  -- (a bucket that cannot be read is full, as the step would make it): if
  -- one falls short of its min_grant, none is granted (each key is written
  -- as a call that wants nothing would write it).
  for i = 1, nkeys do
    local base = 10 * (i - 1)
    local rate, burst = A[base + 1], A[base + 2]
    local t, ts
    local v = rpcall('GET', KEYS[i])
    if type(v) == 'string' then
      t, ts = bucket(v)
    elseif v and find(v.err, 'WRONGTYPE', 1, true) then
      local state = rpcall('HMGET', KEYS[i], 't', 'ts')
      if not state.err then
        t, ts = tonumber(state[1]), tonumber(state[2])
        if t == nil or ts == nil or t % 1 ~= 0 or ts % 1 ~= 0 or
            not (ts >= 0 and ts <= MAX_AMOUNT) then
          t = nil
        end
      end
    end
    if t == nil then
      t = burst
    else
      if t > burst then
        t = burst
      elseif t < -MAX_LIMIT then
        t = -MAX_LIMIT
      end
      t = refill(t, ts, now, rate, burst)
    end
    local g = 0
    if t > 0 then
      g = mmin(A[base + 5], t)
    end
    g = g - fmod(g, A[base + 7])
    if g < A[base + 6] then
      for j = 1, nkeys do
        A[10 * (j - 1) + 5], A[10 * (j - 1) + 6] = 0, 0
      end
      break
    end
  end
end

-- One step for each key.
local out = {}
local o = 0
local nowString = format('%.0f', now) -- every key's ts, but one whose clock went back
for i = 1, nkeys do
  local key = KEYS[i]
  local base = stride * (i - 1)
  local rate, burst, consumed, returned, want, min_grant, quantum =
    A[base + 1], A[base + 2], A[base + 3], A[base + 4], A[base + 5], A[base + 6], A[base + 7]
  local debt = A[base + 8]
  local instance, seq = A[base + 9], A[base + 10]
  local since, claim = SINCE[i] or 0, CLAIM[i] or 0

  -- 0. The state, as a string or as a hash. Anything unreadable is replaced
  -- by a full bucket rather than left stuck: a key of another type, a
  -- string that is not "<t> <ts>", a hash whose t and ts are not the
  -- script's. A call without a record reads the string (GET) first, and a
  -- hash only when the key holds another type; a call with one reads the
  -- hash first. pcall, so that WRONGTYPE is seen here; any other error is
  -- passed on.
  local reset = 0
  local form -- what the key held: 'string', 'hash', 'other' or nil (missing)
  local missing = false -- a hash read as missing: maybe of other fields
  local t, ts
  local p, rs, rg = 0, nil, nil -- p and the record's seq and granted
  local zat, zgrace, zkeep -- a reset's mark (see reset.lua), if readable
  local rfield = instance and ('q:' .. instance)
  local state -- an HMGET reply
  local zi = 4 -- the reset mark's place in it (see reset.lua)
  if since > 0 then
    state, zi = rpcall('HMGET', key, 't', 'ts', 'p', rfield, 'o', 'z'), 6
  elseif rfield then
    state, zi = rpcall('HMGET', key, 't', 'ts', 'p', rfield, 'z'), 5
  end
  if state then
    if state.err and find(state.err, 'WRONGTYPE', 1, true) then
      state = nil
      form = 'string'
    end
  else
    form = 'string'
  end
  if form == 'string' then
    local v = rpcall('GET', key)
    if v == false then
      form = nil -- missing: a full bucket
    elseif type(v) == 'string' then
      t, ts = bucket(v)
      if t == nil then
        reset = 1
      end
    elseif not find(v.err, 'WRONGTYPE', 1, true) then
      return redis.error_reply(v.err)
    elseif rfield then
      form, reset = 'other', 1 -- neither a hash nor a string
    else
      form = 'hash'
      state = rpcall('HMGET', key, 't', 'ts', 'p', 'z')
    end
  end
  if state then
    if state.err then
      if not find(state.err, 'WRONGTYPE', 1, true) then
        return redis.error_reply(state.err)
      end
      form, reset = 'other', 1
    else
      form = 'hash'
      t, ts = tonumber(state[1]), tonumber(state[2])
      if t == nil or ts == nil or t % 1 ~= 0 or ts % 1 ~= 0 or
          not (ts >= 0 and ts <= MAX_AMOUNT) then
        -- Missing (a full bucket, not a reset) unless the hash exists with
        -- other fields (records, p, anything), or with a field that is
        -- there but unreadable. Fields other than those read are told by
        -- the write: the key is missing if it then holds what was written
        -- alone. A call without a record reads a hash only when the key
        -- exists.
        if state[1] or state[2] or state[3] or state[4] or state[5] or not rfield then
          reset = 1
        else
          form, missing = nil, true
        end
        t, ts = nil, nil
      else
        -- Only a readable bucket keeps its records and p.
        local n = tonumber(state[3])
        if n and n >= 0 and n <= MAX_AMOUNT and n % 1 == 0 then
          p = n
        end
        if rfield and state[4] then
          rs, rg = record(state[4])
        end
        if state[zi] then
          zat, zgrace, zkeep = mark(state[zi])
        end
      end
    end
  end
  -- The bucket is written as a string unless the call has a record, or the
  -- key is a readable hash, whose records it keeps.
  local str = not rfield and (form ~= 'hash' or reset == 1)
  local fresh = t == nil and reset == 0 -- missing: full, since when is not known
  if t == nil then
    t, ts = burst, now
  end
  if t > burst then
    t = burst -- the burst was lowered since the last write
  elseif t < -MAX_LIMIT then
    t = -MAX_LIMIT -- deeper than any debt: not the script's
  end

  -- The outage's pool: the refill the bucket lost at its burst while
  -- nobody wrote it, which the late charges of an outage's admissions may
  -- claim back. A call whose outage began after the bucket's last write
  -- (or that finds it missing: expired once full) opens it; a later call
  -- draws on the one an earlier call opened if its own outage began before
  -- that call.
  local pool, pend, hadPool = 0, 0, false
  if since > 0 then
    local old = form == 'hash' and reset == 0 and state and state[5]
    local op, oe
    if old then
      hadPool = true
      op, oe = match(old, '^(%d+) (%d+)$')
      op, oe = tonumber(op), tonumber(oe)
    end
    if fresh then
      -- Expired once full: the refill since, as if it held nothing at
      -- since (a bucket in use; one that held more lost less, and is not
      -- credited all of it).
      if now > since then
        pool, pend = gain(now - since, rate) - burst, now
        if pool < 0 then
          pool = 0
        end
      end
    elseif reset == 0 and ts <= since then
      if now > ts then
        pool = gain(now - ts, rate) - (burst - t) -- exact: below 2^53 and 2^51
        if pool < 0 then
          pool = 0
        end
      end
      pend = now
    elseif op and oe and op <= MAX_AMOUNT and since < oe then
      pool, pend = op, oe
    end
  end
  -- 1. Refill for the time since ts.
  t, ts = refill(t, ts, now, rate, burst)

  local granted = 0
  local dup = 0
  local forgiven = 0
  local credited = 0
  if rs and seq <= rs then
    -- A duplicate changes nothing: it replies what it was granted the
    -- first time (0 if superseded since) and the tokens as refilled,
    -- unwritten.
    if seq == rs then
      granted = rg
      dup = 1
    else
      dup = 2
    end
  else
    -- 2. Allowance given back. A sum past 2^53 rounds to a value still >= burst.
    t = t + returned
    if t > burst then
      t = burst
    end

    -- 2b. The outage's credit: what the call claims of consumed, as far as
    -- the pool holds it, is not charged.
    if claim > 0 and pool > 0 then
      credited = mmin(claim, pool)
      consumed, pool = consumed - credited, pool - credited
    end

    -- 3. Consumption charged: it never sinks the bucket below -debt, and a
    -- bucket in deeper debt already (under a larger debt) stays where it is.
    -- room and consumed - room are exact (room is below 2^51, consumed
    -- below 2^53); t - consumed alone may not be.
    local floor = -debt
    if zat and (now < zgrace or since > 0 and since < zat) then
      -- A reset's grace, or an outage's charge from before the reset:
      -- what was spent before it takes from the new bucket, never into
      -- debt.
      floor = 0
    end
    if t < floor then
      floor = t
    end
    local room = t - floor
    if consumed > room then
      forgiven = consumed - room
      t = floor
    else
      t = t - consumed
    end

    -- 4. Grant a whole number of quanta; the rest of a quantum stays in t.
    -- fmod of two doubles is exact, and granted >= 0.
    if t > 0 then
      granted = want
      if t < want then
        granted = t
      end
    end
    granted = granted - fmod(granted, quantum)
    if granted < min_grant then
      granted = 0
    end
    t = t - granted

    -- 5. Write, with a TTL that ends when the bucket is full again:
    -- ceil((burst - t) * 1000 / rate) ms after ts. The quotient is exact up
    -- to the ceiling when the numerator is below 2^53; above, one more ms
    -- keeps the key from expiring (and so reading as full) too early.
    local num = (burst - t) * 1000
    local ttl = ceil(num / rate)
    if num >= EXACT then
      ttl = ttl + 1
    end
    if ts > now then
      ttl = ttl + ceil((ts - now) / 1000)
    end
    if zkeep and zkeep > now and ttl < ceil((zkeep - now) / 1000) then
      ttl = ceil((zkeep - now) / 1000) -- a reset's mark is kept that long
    end
    if ttl < 1000 then
      ttl = 1000
    elseif ttl > MAX_TTL_MS then
      ttl = MAX_TTL_MS
    end
    local sts = nowString
    if ts ~= now then
      sts = format('%.0f', ts)
    end
    if str then
      -- A string "<t> <ts>" with its TTL: one command.
      rcall('SET', key, format('%.0f ', t) .. sts, 'PX', ttl)
    else
      local st = format('%.0f', t)
      if form and form ~= 'hash' or reset == 1 then
        -- A string or another type made a hash, or an unreadable hash
        -- replaced. SET first: a full Redis (maxmemory) refuses it, and so
        -- the call, as it refuses every call that writes. DEL is no write
        -- it refuses, and once a script has written, Redis lets its later
        -- writes through (a script is never applied in part): a DEL first
        -- would let the call through whole.
        rcall('SET', key, '')
        rcall('DEL', key)
      end
      local rec, written = nil, 2
      local pv -- the pool's field, if it is kept
      if pool > 0 then
        pv = format('%.0f %.0f', pool, pend)
      end
      if pv then
        rec, written = format('%.0f %.0f %.0f', seq, granted, now), 4
        rcall('HSET', key, 't', st, 'ts', sts, rfield, rec, 'o', pv)
      elseif rfield then
        rec, written = format('%.0f %.0f %.0f', seq, granted, now), 3
        rcall('HSET', key, 't', st, 'ts', sts, rfield, rec)
        if hadPool then
          rcall('HDEL', key, 'o') -- drawn, or of an outage that ended before this call's
        end
      else
        rcall('HSET', key, 't', st, 'ts', sts)
      end
      -- A call without a record adds no field to a readable bucket: the
      -- hash is counted only after a record.
      local fields = written
      if rfield and form == 'hash' and reset == 0 or missing then
        fields = rcall('HLEN', key)
      end
      if missing and fields > written then
        -- A hash of fields that are not the script's: replaced, as
        -- unreadable. The step was the same on a full bucket.
        reset = 1
        rcall('DEL', key)
        if pv then
          rcall('HSET', key, 't', st, 'ts', sts, rfield, rec, 'o', pv)
        elseif rfield then
          rcall('HSET', key, 't', st, 'ts', sts, rfield, rec)
        else
          rcall('HSET', key, 't', st, 'ts', sts)
        end
        fields = written
      end

      -- Prune the records older than PRUNE_AGE_US (and unreadable ones) once
      -- the hash has more than doubled since the last prune: a prune reads
      -- every field, and more than half of them were added since, one
      -- record per call. Fields are only added between prunes, so a p above
      -- HLEN is wrong (written by someone else) and is mended by a prune too.
      if rfield and (fields > 2 * p and fields > PRUNE_MIN or p > fields) then
        local fv = rcall('HGETALL', key)
        local old = {}
        local hasP = false
        for j = 1, #fv, 2 do
          local f = fv[j]
          if f == 'p' then
            hasP = true
          elseif sub(f, 1, 2) == 'q:' then
            local _, _, rnow = record(fv[j + 1])
            if rnow == nil or rnow < now - PRUNE_AGE_US then
              old[#old + 1] = f
            end
          end
        end
        for j = 1, #old, HDEL_CHUNK do
          rcall('HDEL', key, unpack(old, j, mmin(j + HDEL_CHUNK - 1, #old)))
        end
        fields = fields - #old
        if not hasP then
          fields = fields + 1
        end
        rcall('HSET', key, 'p', format('%.0f', fields))
      end
      rcall('PEXPIRE', key, ttl)
    end
  end

  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = granted, t, now, reset, dup, forgiven, credited
  o = o + 7
end
return out
