-- control: a worker's periodic look at its running tracked jobs, sent with its lock renewal
-- (no call per job). Records who runs each job and since when (once per consumer), and
-- answers the jobs whose cancellation was requested.
--
-- Only entries still pending for this consumer count: a worker that lost a job to a reclaim
-- neither claims its record back nor hears its cancel requests.
--
-- KEYS[1]  tracked hash    KEYS[2]  stream
-- ARGV[1]  consumer    ARGV[2]  group
-- then per job: job id, entry id, start time (ms, server clock)
--
-- Returns: the job ids (of those given) with a cancel request.
local tracked, stream, consumer, group = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 3 do
  local jid, id = ARGV[i], ARGV[i + 1]
  local cur = redis.call('HGET', tracked, jid)
  if cur then
    local rec = cjson.decode(cur)
    if rec.e == id and owner(stream, group, id) == consumer then
      if rec.c ~= consumer then
        rec.c, rec.s = consumer, tonumber(ARGV[i + 2])
        pcall(redis.call, 'HSET', tracked, jid, cjson.encode(rec))
      end
      if rec.x then out[#out + 1] = jid end
    end
  end
end
return out
