-- promote: move due delayed jobs into the stream, oldest first, in a bounded batch.
-- Safe to run from every worker at once: each job is moved by exactly one call.
--
-- KEYS[1]  delayed zset    KEYS[2]  jobs hash    KEYS[3]  stream    KEYS[4]  tracked hash
-- ARGV[1]  the most jobs to move in this call
--
-- A delayed record is keyed by its member (zset member = jobs hash field), a unique token
-- per record ('<job id>:<random>'), not by the job id: the entry's fields carry the id.
-- Records keyed by a bare job id (written by older versions) move the same way.
-- A tracked job (a 'ctl' field) whose location record names this member is re-pointed at
-- its new stream entry.
--
-- Returns: {moved, next due time in ms or -1 when nothing is delayed, server now in ms}
local delayed, jobs, stream, tracked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  tonumber(ARGV[1]))
local moved = 0
for i = 1, #due, 2 do
  local member = due[i]
  local raw = redis.call('HGET', jobs, member)
  if raw then
    local fields = cjson.decode(raw)
    fields[2] = due[i + 1]
    local new_id = redis.call('XADD', stream, '*', unpack(fields))
    if ctl_of(fields) then
      local cur = redis.call('HGET', tracked, fields[4])
      local rec = cur and cjson.decode(cur)
      if rec and rec.m == member then
        rec.m, rec.e = nil, new_id
        -- pcall: a refusal (maxmemory) must not stop the move half-way (the job would be
        -- promoted again); the record then names the old member until the job settles.
        pcall(redis.call, 'HSET', tracked, fields[4], cjson.encode(rec))
      end
    end
    redis.call('HDEL', jobs, member)
    moved = moved + 1
  end
  redis.call('ZREM', delayed, member)
end
local nxt = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local next_due = -1
if #nxt > 0 then next_due = tonumber(nxt[2]) end
return {moved, next_due, now}
