-- cancel: cancel a tracked job (streamq.jobstatus). A waiting or delayed job is removed in
-- this one step, so it never starts; a running job gets a cancel request ("x" in its location
-- record) that its worker observes with its lock renewals. The dedup marker, if any, stays.
--
-- KEYS[1]  tracked hash    KEYS[2]  the job's final record (result:<job id>)
-- KEYS[3]  stream    KEYS[4]  delayed zset    KEYS[5]  jobs hash
-- ARGV[1]  group    ARGV[2]  job id
--
-- Returns: {outcome, detail}: 'removed' (it was waiting or delayed; detail: which),
-- 'requested' (it is running; detail: the consumer), 'finished' (detail: its final state),
-- or 'unknown'.
local tracked, final, stream, delayed, jobs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, jid = ARGV[1], ARGV[2]

local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

local function removed(rec, fields, was)
  redis.call('HDEL', tracked, jid)
  write_final(final, {state = 'cancelled', reason = 'cancelled', at = now_ms(),
    n = field(fields, 'name'), a = tonumber(field(fields, 'attempt'))}, tonumber(rec.k) or 0)
  return {'removed', was}
end

local cur = redis.call('HGET', tracked, jid)
if cur then
  local rec = cjson.decode(cur)
  if rec.e then
    local o = owner(stream, group, rec.e)
    if o then
      rec.x = 1
      redis.call('HSET', tracked, jid, cjson.encode(rec))
      return {'requested', o}
    end
    local e = redis.call('XRANGE', stream, rec.e, rec.e)
    if #e > 0 then
      redis.call('XDEL', stream, rec.e)
      return removed(rec, e[1][2], 'waiting')
    end
  elseif rec.m then
    local body = redis.call('HGET', jobs, rec.m)
    if body then
      redis.call('ZREM', delayed, rec.m)
      redis.call('HDEL', jobs, rec.m)
      return removed(rec, cjson.decode(body), 'delayed')
    end
  end
  -- A record whose job is gone (its entry was deleted while pending): forget it.
  redis.call('HDEL', tracked, jid)
end
local done = redis.call('LINDEX', final, 0)
if done then return {'finished', cjson.decode(done).state} end
return {'unknown', ''}
