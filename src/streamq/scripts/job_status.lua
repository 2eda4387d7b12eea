-- job_status: where a tracked job is, read in one atomic step without scanning a stream.
-- Read-only.
--
-- KEYS[1]  tracked hash    KEYS[2]  the job's final record (result:<job id>)
-- KEYS[3]  stream    KEYS[4]  delayed zset    KEYS[5]  jobs hash
-- ARGV[1]  group    ARGV[2]  job id
--
-- Returns: one of:
--   {'active', record, entry id, consumer, ms idle, deliveries, {entry fields, flat}}
--   {'waiting', record, entry id, '', 0, 0, {entry fields, flat}}
--   {'delayed', record, member, '', due ms, 0, the delayed record (JSON array of fields)}
--   {'final', final record JSON}     the job finished and its final record is kept
--   {'unknown'}                      never tracked here, or finished and forgotten
-- `record` is the location record (JSON: "e" entry or "m" member, "k" keep ms, "x" cancel
-- requested, "c"/"s" consumer and start, "p"/"d" progress).
local tracked, final, stream, delayed, jobs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, jid = ARGV[1], ARGV[2]
local cur = redis.call('HGET', tracked, jid)
if cur then
  local rec = cjson.decode(cur)
  if rec.e then
    local ok, p = pcall(redis.call, 'XPENDING', stream, group, rec.e, rec.e, 1)
    local e = redis.call('XRANGE', stream, rec.e, rec.e)
    if #e > 0 then
      if ok and #p > 0 then
        return {'active', cur, rec.e, p[1][2], p[1][3], p[1][4], e[1][2]}
      end
      return {'waiting', cur, rec.e, '', 0, 0, e[1][2]}
    end
  elseif rec.m then
    local due = redis.call('ZSCORE', delayed, rec.m)
    local body = redis.call('HGET', jobs, rec.m)
    if due and body then
      return {'delayed', cur, rec.m, '', due, 0, body}
    end
  end
end
local done = redis.call('LINDEX', final, 0)
if done then return {'final', done} end
return {'unknown'}
