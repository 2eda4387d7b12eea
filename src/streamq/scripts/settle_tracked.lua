-- settle_tracked: settle one tracked job (streamq.jobstatus), fenced on ownership, and keep
-- its location record and final record in step with it. Untracked jobs never come here.
-- A re-sent call (same token) returns the first send's reply.
--
-- KEYS[1]  stream    KEYS[2]  starts hash    KEYS[3]  this call's memo (settled:<token>)
-- KEYS[4]  tracked hash    KEYS[5]  delayed zset    KEYS[6]  jobs hash    KEYS[7]  dead stream
-- KEYS[8]  the job's final record (result:<job id>)
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3]  entry id    ARGV[4]  memo lifetime ms
-- ARGV[5]  job id   ARGV[6]  action: complete | cancel | retry | fail
-- ARGV[7]  keep ms (how long the final record lives; 0 = none is written)
-- ARGV[8]  the final record's fields as a JSON object (state and time are added here)
-- ARGV[9]  retry: the delayed member    ARGV[10]  retry: delay ms
-- ARGV[11] fail: dead-letter cap (approximate MAXLEN; 0 = uncapped)
-- ARGV[12..]  retry: the new envelope fields, flat ('due' first, set here; then 'ctl'...);
--             fail: the dead-letter fields, flat
--
-- A cancel request (the location record's "x") turns a retry or a dead letter into a cancel:
-- a job cancelled while it ran is never run again, and is not dead-lettered. A job that
-- completes despite the request is completed.
--
-- Returns: {status, outcome}: status 1 applied, 0 pending for another consumer, -1 pending
-- for no one (nothing changed for 0 and -1); outcome 'c' completed, 'x' cancelled,
-- 'r' retried (delayed), 'd' dead-lettered, '' when nothing was applied.
-- Under maxmemory (noeviction) a retry's ZADD or a dead letter's XADD is refused before any
-- XACK: the call fails with nothing changed. A refused final record does not stop the settle.
local stream, starts, memo, tracked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local delayed, jobs, dead, final = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local group, consumer, id, jid = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local before = redis.call('GET', memo)
if before then
  return {MEMO_STATUS[string.sub(before, 1, 1)], string.sub(before, 2)}
end

local s = settle_status(stream, group, consumer, id)
local outcome = ''
if s == APPLIED then
  local cur = redis.call('HGET', tracked, jid)
  local rec = cur and cjson.decode(cur)
  -- A record that names another entry is another copy's (an id added again): left alone.
  local ours = rec == nil or rec.e == id
  local action = ARGV[6]
  if ours and rec and rec.x and (action == 'retry' or action == 'fail') then
    action = 'cancel'
  end
  local fields = {}
  for i = 12, #ARGV do fields[#fields + 1] = ARGV[i] end
  local now = now_ms()
  if action == 'retry' then
    local due = now + tonumber(ARGV[10])
    fields[2] = tostring(due)
    redis.call('ZADD', delayed, due, ARGV[9])
    redis.call('HSET', jobs, ARGV[9], cjson.encode(fields))
    if ours then
      local k = tonumber(ARGV[7])
      if rec then k = rec.k end
      -- pcall: after the ZADD a refusal must not leave the job both delayed and pending.
      pcall(redis.call, 'HSET', tracked, jid, cjson.encode({m = ARGV[9], k = k}))
    end
    outcome = 'r'
  elseif action == 'fail' then
    fields[#fields + 1] = 'failed_at'
    fields[#fields + 1] = tostring(now)
    local cap = tonumber(ARGV[11])
    if cap > 0 then
      redis.call('XADD', dead, 'MAXLEN', '~', cap, '*', unpack(fields))
    else
      redis.call('XADD', dead, '*', unpack(fields))
    end
    outcome = 'd'
  elseif action == 'cancel' then
    outcome = 'x'
  else
    outcome = 'c'
  end
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  redis.call('HDEL', starts, id)
  if outcome ~= 'r' then
    if rec and ours then redis.call('HDEL', tracked, jid) end
    local record = cjson.decode(ARGV[8])
    record.state = ({c = 'completed', x = 'cancelled', d = 'dead'})[outcome]
    record.at = now
    if outcome == 'x' then record.reason = 'cancelled' end
    write_final(final, record, tonumber(ARGV[7]))
  end
end
-- pcall: the memo may be refused under maxmemory, the reply must still go out (_prelude.lua).
pcall(redis.call, 'SET', memo, MEMO_CHAR[s] .. outcome, 'PX', ARGV[4])
return {s, outcome}
