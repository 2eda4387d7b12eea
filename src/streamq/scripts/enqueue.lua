-- enqueue: add a batch of jobs to one shard, each ready now or delayed, with optional dedup.
--
-- KEYS[1]  stream    KEYS[2]  delayed zset    KEYS[3]  jobs hash
-- KEYS[4..] dedup marker keys, one per job whose has_dedup flag is 1, in job order
-- ARGV[1]  dedup window (ms)
-- ARGV[2]  F, the number of envelope fields per job
-- ARGV[3 .. 2+F]  the field names (the first one is 'due')
-- then, per job: member, delay ms (0 = ready now), has_dedup (0/1), F field values
--   member: for a delayed job, the unique key of its record (delayed zset member, jobs hash
--   field), '<job id>:<random>' and never the bare job id, so that two accepted adds of one
--   id are two jobs; ignored for a ready job. The job id itself is among the field values.
--
-- Returns: one integer per job: 1 added, 0 skipped because its dedup marker exists.
-- Every write of a job happens in this one call: a job is fully enqueued or not at all.
local stream, delayed, jobs = KEYS[1], KEYS[2], KEYS[3]
local window = tonumber(ARGV[1])
local nf = tonumber(ARGV[2])
local names = {}
for i = 1, nf do names[i] = ARGV[2 + i] end
local now = nil
local out = {}
local a = 3 + nf
local k = 4
while a <= #ARGV do
  local member, delay, has_dedup = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  local fields = {}
  for i = 1, nf do
    fields[2 * i - 1] = names[i]
    fields[2 * i] = ARGV[a + 2 + i]
  end
  a = a + 3 + nf
  local fresh = true
  if has_dedup == '1' then
    fresh = redis.call('SET', KEYS[k], '1', 'NX', 'PX', window)
    k = k + 1
  end
  if fresh then
    if delay > 0 then
      now = now or now_ms()
      fields[2] = tostring(now + delay)
      redis.call('ZADD', delayed, now + delay, member)
      redis.call('HSET', jobs, member, cjson.encode(fields))
    else
      redis.call('XADD', stream, '*', unpack(fields))
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
