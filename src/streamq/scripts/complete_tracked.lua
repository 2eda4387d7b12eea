-- complete_tracked: complete (or cancel) many tracked jobs of one shard in one call, fenced on
-- ownership: the batched twin of settle_tracked's complete and cancel (streamq.jobstatus).
-- A re-sent call (same token) returns the first send's reply.
--
-- KEYS[1]  stream    KEYS[2]  starts hash    KEYS[3]  this call's memo (settled:<token>)
-- KEYS[4]  tracked hash    KEYS[5..]  each job's final record (result:<job id>), in job order
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3]  memo lifetime ms
-- then per job: entry id, job id, action (complete | cancel), keep ms (0 = no final record),
--   the final record's fields (JSON object; state and time are added here)
--
-- Returns: {statuses, outcomes}: one status per job (1 applied, 0 pending for another
-- consumer, -1 pending for no one: nothing changed for 0 and -1), and one character per job:
-- 'c' completed, 'x' cancelled, '-' not applied.
-- Under maxmemory (noeviction) it still acks and deletes; a refused final record is skipped.
local stream, starts, memo, tracked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer = ARGV[1], ARGV[2]
local before = redis.call('GET', memo)
if before then
  local statuses = {}
  for i = 1, #before, 2 do statuses[#statuses + 1] = MEMO_STATUS[string.sub(before, i, i)] end
  local outcomes = {}
  for i = 2, #before, 2 do outcomes[#outcomes + 1] = string.sub(before, i, i) end
  return {statuses, table.concat(outcomes)}
end

local now = now_ms()
local statuses, outcomes, memo_chars = {}, {}, {}
local n = 0
for a = 4, #ARGV, 5 do
  n = n + 1
  local id, jid, action = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local s = settle_status(stream, group, consumer, id)
  local o = '-'
  if s == APPLIED then
    local cur = redis.call('HGET', tracked, jid)
    if cur and cjson.decode(cur).e == id then redis.call('HDEL', tracked, jid) end
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    redis.call('HDEL', starts, id)
    local record = cjson.decode(ARGV[a + 4])
    if action == 'cancel' then
      o, record.state, record.reason = 'x', 'cancelled', 'cancelled'
    else
      o, record.state = 'c', 'completed'
    end
    record.at = now
    write_final(KEYS[4 + n], record, tonumber(ARGV[a + 3]))
  end
  statuses[n] = s
  outcomes[n] = o
  memo_chars[n] = MEMO_CHAR[s] .. o
end
-- pcall: the memo may be refused under maxmemory, the reply must still go out (_prelude.lua).
pcall(redis.call, 'SET', memo, table.concat(memo_chars), 'PX', ARGV[3])
return {statuses, table.concat(outcomes)}
