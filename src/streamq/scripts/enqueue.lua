-- enqueue: add a batch of jobs to one shard, each ready now or delayed, with optional dedup
-- and optional tracking (status, cancel, progress, result: see streamq.jobstatus).
--
-- KEYS[1]  stream    KEYS[2]  delayed zset    KEYS[3]  jobs hash    KEYS[4]  tracked hash
-- KEYS[5..] dedup marker keys, one per job whose flags have the dedup bit, in job order
-- ARGV[1]  dedup window (ms)
-- ARGV[2]  F, the number of envelope fields per job
-- ARGV[3 .. 2+F]  the field names (the first one is 'due', the second 'id')
-- then, per job: member, delay ms (0 = ready now), flags, F field values, and when the
--   tracked bit is set one more value: the job's 'ctl' field (JSON of its tracking options)
--   member: for a delayed job, the unique key of its record (delayed zset member, jobs hash
--   field), '<job id>:<random>' and never the bare job id, so that two accepted adds of one
--   id are two jobs; ignored for a ready job. The job id itself is among the field values.
--   flags: 1 dedup (a marker key comes in KEYS), 2 tracked, 3 both.
--
-- A tracked job carries an extra envelope field 'ctl' after the F fields, and its location
-- is recorded in the tracked hash: job id -> {"e": <entry id>} (ready) or {"m": <member>}
-- (delayed), plus "k": how long its final record is kept (ms). Untracked jobs write nothing
-- there.
--
-- Returns: one integer per job: 1 added, 0 skipped because its dedup marker exists; a
-- WRONGTYPE error, before any write, when one of KEYS[1..4] holds another type.
-- Every write of a job happens in this one call: a job is fully enqueued or not at all.
local stream, delayed, jobs, tracked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- A key of the wrong type would fail a write half-way (a dedup marker set, its job not
-- written): refuse before writing anything.
for _, t in ipairs({
  {'stream', redis.call('TYPE', stream)['ok'], 'stream'},
  {'delayed', redis.call('TYPE', delayed)['ok'], 'zset'},
  {'jobs', redis.call('TYPE', jobs)['ok'], 'hash'},
  {'tracked', redis.call('TYPE', tracked)['ok'], 'hash'},
}) do
  if t[2] ~= t[3] and t[2] ~= 'none' then
    return redis.error_reply('WRONGTYPE the shard\'s ' .. t[1] .. ' key holds a ' .. t[2]
      .. ', not a ' .. t[3])
  end
end
local window = tonumber(ARGV[1])
local nf = tonumber(ARGV[2])
local names = {}
for i = 1, nf do names[i] = ARGV[2 + i] end
local now = nil
local out = {}
local a = 3 + nf
local k = 5
while a <= #ARGV do
  local member, delay, flags = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local fields = {}
  for i = 1, nf do
    fields[2 * i - 1] = names[i]
    fields[2 * i] = ARGV[a + 2 + i]
  end
  a = a + 3 + nf
  local ctl = nil
  if flags >= 2 then
    ctl = ARGV[a]
    a = a + 1
    fields[#fields + 1] = 'ctl'
    fields[#fields + 1] = ctl
  end
  local fresh = true
  if flags % 2 == 1 then
    fresh = redis.call('SET', KEYS[k], '1', 'NX', 'PX', window)
    k = k + 1
  end
  if fresh then
    local where
    if delay > 0 then
      now = now or now_ms()
      fields[2] = tostring(now + delay)
      redis.call('ZADD', delayed, now + delay, member)
      redis.call('HSET', jobs, member, cjson.encode(fields))
      where = {m = member}
    else
      where = {e = redis.call('XADD', stream, '*', unpack(fields))}
    end
    if ctl then
      -- pcall: refused under maxmemory after the job was written, the job must still count
      -- as added (a caller would add it again); it is then tracked from its first settle.
      where.k = tonumber(cjson.decode(ctl).keep) or 0
      pcall(redis.call, 'HSET', tracked, fields[4], cjson.encode(where))
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
